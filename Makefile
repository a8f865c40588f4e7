# acchead: `make test` and `make demo` work on a fresh clone; both create .venv on first use.
#
#   make venv                 create/reuse .venv; install torch==2.13.0 (CPU wheel) if no torch, then acchead[dev]
#   make test                 run the test suite (slow and GPU tests are skipped; `make test PYTEST_ARGS="-m slow"`)
#   make demo                 load the embedded demo pair and let the target complete a HumanEval prompt
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

.PHONY: help venv test demo lint

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

demo: $(STAMP)
	$(PY) -m acchead.zoo.demo

lint: $(STAMP)
	$(PY) -m ruff check .
