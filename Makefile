# acchead: `make test` and `make demo` work on a fresh clone; both create .venv on first use.
#
#   make venv                 create/reuse .venv; install torch==2.13.0 (CPU wheel) if no torch, then acchead[dev]
#   make test                 run the test suite (slow and GPU tests are skipped; `make test PYTEST_ARGS="-m slow"`)
#   make demo                 the whole pipeline on the embedded demo pair, every stage on its defaults:
#                             gen-data on stdlib prompts (greedy S, r = 1) -> train the shipped heads'
#                             recipe (lookahead, state+token, w_rej 3, depth 3) -> bench every method on
#                             HumanEval -> runs/demo/bench/report.md; rerunning resumes where it stopped
#   make pair                 load the demo pair and let the target complete a HumanEval prompt
#   make lint                 ruff check
#
# GPU users bring their own torch: either install your CUDA build into .venv before `make venv`
# (`python3 -m venv .venv && .venv/bin/pip install torch --index-url <your CUDA index>`) -- a torch that
# imports is kept -- or reuse a system torch with `make venv TORCH=skip VENV_ARGS=--system-site-packages`.

PYTHON ?= python3
VENV ?= .venv
VENV_ARGS ?=
# The torch requirement installed when the venv has no torch; `skip` installs none (bring your own).
# Pinned: the CPU wheel; an unpinned `torch` would pull the newest CUDA build (GBs).
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.acchead-installed

# Demo sizes: prompts labelled by gen-data, HumanEval prompts and tokens per prompt in the bench.
DEMO_DIR ?= runs/demo
DEMO_GEN_PROMPTS ?= 1000
DEMO_BENCH_PROMPTS ?= 10
DEMO_NEW_TOKENS ?= 128
BIN := $(VENV)/bin

.PHONY: help venv test demo pair lint

help:
	@sed -n '1,/^$$/p' Makefile | sed 's/^# \{0,1\}//'

$(PY):
	$(PYTHON) -m venv $(VENV_ARGS) $(VENV)

# Reinstall when the dependency list changes; an editable install picks up source edits by itself.
$(STAMP): pyproject.toml | $(PY)
	@if [ "$(TORCH)" != "skip" ] && ! $(PY) -c "import torch" 2>/dev/null; then \
		echo "installing $(TORCH) (no torch in $(VENV))"; \
		$(PY) -m pip install "$(TORCH)"; \
	fi
	$(PY) -m pip install -e ".[dev]"
	@touch $@

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# Each stage is skipped when its output is complete (gen-data writes gen_config.json last; a killed
# gen-data or bench resumes from its shards / partial results when rerun).
demo: $(DEMO_DIR)/head/head.safetensors
	$(BIN)/acchead-bench --prompts humaneval --num-prompts $(DEMO_BENCH_PROMPTS) --max-new-tokens $(DEMO_NEW_TOKENS) \
		--head $(DEMO_DIR)/head/head.safetensors --out $(DEMO_DIR)/bench
	@cat $(DEMO_DIR)/bench/report.md

$(DEMO_DIR)/data/gen_config.json: | $(STAMP)
	$(BIN)/acchead-gen-data --num-prompts $(DEMO_GEN_PROMPTS) --max-new-tokens $(DEMO_NEW_TOKENS) --out $(DEMO_DIR)/data

$(DEMO_DIR)/head/head.safetensors: $(DEMO_DIR)/data/gen_config.json
	$(BIN)/acchead-train --data $(DEMO_DIR)/data --out $(DEMO_DIR)/head

pair: $(STAMP)
	$(PY) -m acchead.zoo.demo

lint: $(STAMP)
	$(PY) -m ruff check .
