"""In-context continual learning with linear attention (issue 18, item 2): closed forms vs
Monte Carlo, task-order sensitivity, a trained linear-attention layer vs the theory."""
