"""Small-scale checks of each paper's claims; `python experiments/reproduce.py` runs them."""
