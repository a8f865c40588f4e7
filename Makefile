# acchead: `make test` and `make demo` work on a fresh clone; both create .venv on first use.
#
#   make venv                 create/reuse .venv; install torch==2.13.0 (CPU wheel) if no torch, then acchead[dev]
#                             with the exact versions of requirements/lock.txt (the set the suite last passed with)
#   make test                 run the test suite in .venv (slow and GPU tests are skipped; `make test PYTEST_ARGS="-m slow"`)
#                             on PYTEST_WORKERS pytest-xdist workers (2, one per core of CI; 0 runs in one process)
#   make test-latest          the suite in .venv-latest with the newest release of every dependency (torch stays
#                             the lock's CPU wheel); when it passes, `make lock` adopts those versions
#   make test-oldest          the suite in .venv-oldest with the oldest supported releases (requirements/oldest.txt)
#   make lock                 rewrite requirements/lock.txt from the versions `make test-latest` passed with
#   make demo                 the whole pipeline on the real pair (SmolLM2-135M-Instruct and its shipped distilled
#                             draft; docs/real-pair.md): install the assets (acchead-assets) -> gen-data on held-out
#                             ShareGPT prompts -> acchead-train --w-rej 6 --depth 3 -> bench AR, fixed K,
#                             SpecDec++, copy rounds and the oracle on MT-bench and HumanEval, side by side ->
#                             runs/demo-smollm2/bench-*/report.md
#   make demo-toy             the same on the embedded demo pair, every stage on its defaults: gen-data on stdlib
#                             prompts (greedy S, r = 1) -> train the shipped heads' recipe (lookahead, state+token,
#                             w_rej 3, depth 3) -> bench every method on HumanEval -> runs/demo/bench/report.md
#                             (both demos resume where they stopped when rerun)
#   make pair                 load the demo pair and let the target complete a HumanEval prompt
#   make gpu-check            first run on a freshly lent GPU (<= 10 min): greedy exactness on CUDA in float32 and
#                             bfloat16, tokens/s of AR, the best fixed K and SpecDec++ on the toy pair and (when
#                             installed) the real pair, then the GPU tests -> runs/gpu-check/report.md;
#                             GPU_CHECK_ARGS="--device cpu" runs the same on the CPU (the GPU tests' CPU twins instead)
#   make lint                 ruff check
#
# GPU users bring their own torch: either install your CUDA build into .venv before `make venv`
# (`python3 -m venv .venv && .venv/bin/pip install torch --index-url <your CUDA index>`) -- a torch that
# imports is kept, and the lock's torch line is then left out -- or reuse a system torch with
# `make venv TORCH=skip VENV_ARGS=--system-site-packages`.

PYTHON ?= python3
VENV ?= .venv
VENV_ARGS ?=
# The torch requirement installed when the venv has no torch; `skip` installs none (bring your own).
# Pinned: the CPU wheel; an unpinned `torch` would pull the newest CUDA build (GBs).
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=
# pytest-xdist workers; `--dist loadgroup` keeps the tests that share the compiled pair on one (tests/conftest.py)
PYTEST_WORKERS ?= 2
XDIST = -n $(PYTEST_WORKERS) --dist loadgroup
PY := $(VENV)/bin/python
STAMP := $(VENV)/.acchead-installed
# Exact versions the suite passed with (`make test` and .ci/run install with them as pip constraints).
LOCK ?= requirements/lock.txt
OLDEST ?= requirements/oldest.txt
LOCKED_TORCH := $(shell sed -n 's/^torch==//p' $(LOCK))

# Real-pair demo sizes (a fresh 2-core machine, <= 30 min): held-out ShareGPT prompts labelled by gen-data,
# prompts of each bench set, tokens per prompt, and the bench's methods and grids.
REAL_DIR ?= runs/demo-smollm2
REAL_GEN_PROMPTS ?= 128
# The real pair's head reads the draft's confidence (log q, entropy, top log-probs) and not its state, which it
# overfits on the demo's 7,093 training positions: validation AUROC 0.819 against 0.802 over four splits, and
# SpecDec++ 1.043x / 1.048x the best K in the demo's bench against 1.039x / 0.991x (docs/real-pair.md,
# "What the head reads").
REAL_HEAD_INPUTS ?= logq+entropy+topk
# 64 passes over the demo's positions, not acchead-train's 8 (measured on the toy pair): a head of 10 inputs
# is still learning at 24 (AUROC 0.801; 0.819 at 64, 0.822 at 128; docs/real-pair.md, "What the head reads").
REAL_HEAD_EPOCHS ?= 64
# A head 32 wide: every width from 8 to 576 ranked within 0.01 AUROC of the others, and a narrow one costs
# a quarter of the 576-wide one per drafted candidate (docs/real-pair.md, "A narrower head").
REAL_HEAD_WIDTH ?= 32
# A feature draft's candidates labelled per round by gen-data (1: first candidates only; docs/real-pair.md).
REAL_FEATURE_CHAIN ?= 1
REAL_BENCH_PROMPTS ?= 8
REAL_NEW_TOKENS ?= 64
# Copy rounds beside the draft's (copy+POLICY): on HumanEval a third fewer target forwards than the best K
# (docs/real-pair.md, "Copy rounds").
REAL_COPY_SPECS ?= copy+specdec:k=2;copy+specdecpp:h=0.5;copy+specdecpp:h=0.9
REAL_BENCH ?= --pair smollm2 --num-prompts $(REAL_BENCH_PROMPTS) --max-new-tokens $(REAL_NEW_TOKENS) \
	--config configs/bench-smollm2.yaml \
	--methods autoregressive,specdec,specdecpp,oracle,extra --extra-specs "$(REAL_COPY_SPECS)" \
	--k-grid 1,2,3,4,6 --h-grid 0.3,0.5,0.7,0.9 \
	--loop-profile-prompts 0 \
	--head $(REAL_DIR)/head/head.safetensors
# Toy demo sizes: prompts labelled by gen-data, HumanEval prompts and tokens per prompt in the bench.
DEMO_DIR ?= runs/demo
DEMO_GEN_PROMPTS ?= 1000
DEMO_BENCH_PROMPTS ?= 10
DEMO_NEW_TOKENS ?= 128
BIN := $(VENV)/bin

.PHONY: help venv test test-latest test-oldest lock demo demo-toy assets pair gpu-check lint

help:
	@sed -n '1,/^$$/p' Makefile | sed 's/^# \{0,1\}//'

$(PY):
	$(PYTHON) -m venv $(VENV_ARGS) $(VENV)

# install-into VENV CONSTRAINTS: torch first when the venv has none (the pinned CPU wheel), then acchead[dev]
# under CONSTRAINTS; their torch line is dropped when the venv's torch is another build (a user's CUDA torch).
define install-into
	@if [ "$(TORCH)" != "skip" ] && ! $(1)/bin/python -c "import torch" 2>/dev/null; then \
		echo "installing $(TORCH) (no torch in $(1))"; \
		$(1)/bin/python -m pip install "$(TORCH)"; \
	fi
	@have=$$($(1)/bin/python -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null); \
	if [ -n "$$have" ] && ! grep -qx "torch==$$have" $(2); then \
		echo "keeping $(1)'s torch $$have (not the constraints' torch)"; grep -v '^torch==' $(2) > $(1)/constraints.txt; \
	else cp $(2) $(1)/constraints.txt; fi
	$(1)/bin/python -m pip install -e ".[dev]" -c $(1)/constraints.txt
endef

# Reinstall when the dependency list or the lock changes; an editable install picks up source edits by itself.
$(STAMP): pyproject.toml $(LOCK) | $(PY)
	$(call install-into,$(VENV),$(LOCK))
	@touch $@

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# The newest releases of the day (no constraint but the lock's torch: a newer torch from the index is a CUDA
# build of several GB). Reinstalled on every run, so a release published since the last run is seen.
test-latest:
	@[ -x .venv-latest/bin/python ] || $(PYTHON) -m venv .venv-latest
	@echo "torch==$(LOCKED_TORCH)" > .venv-latest/torch.txt
	@.venv-latest/bin/python -c "import torch" 2>/dev/null || .venv-latest/bin/python -m pip install "torch==$(LOCKED_TORCH)"
	.venv-latest/bin/python -m pip install --upgrade --upgrade-strategy eager -e ".[dev]" -c .venv-latest/torch.txt
	.venv-latest/bin/python -m pip freeze --exclude-editable > .venv-latest/tested.txt
	.venv-latest/bin/python -m pytest $(XDIST) $(PYTEST_ARGS)
	@cp .venv-latest/tested.txt .venv-latest/passed.txt
	@echo "passed with the newest releases: \`make lock\` writes them to $(LOCK)"

# The oldest supported releases (pyproject's lower bounds, resolved once and frozen in $(OLDEST)).
test-oldest:
	@[ -x .venv-oldest/bin/python ] || $(PYTHON) -m venv .venv-oldest
	$(call install-into,.venv-oldest,$(OLDEST))
	.venv-oldest/bin/python -m pytest $(XDIST) $(PYTEST_ARGS)

# Adopt the versions the last passing `make test-latest` ran with.
lock:
	@[ -f .venv-latest/passed.txt ] || { echo "no passing \`make test-latest\` run: run it first"; exit 1; }
	@{ sed -n '1,/^$$/p' $(LOCK); sed 's/^torch==\(.*\)+cpu$$/torch==\1/' .venv-latest/passed.txt; } > $(LOCK).tmp
	@mv $(LOCK).tmp $(LOCK) && echo "$(LOCK) now pins $$(grep -c '==' $(LOCK)) packages"

# Each stage is skipped when its output is complete (gen-data writes gen_config.json last; a killed
# gen-data or bench resumes from its shards / partial results when rerun).
# The two benches run side by side, one torch thread each (a 2-core box's two cores); MT-bench's progress
# goes to its log, HumanEval's to the terminal.
demo: $(REAL_DIR)/head/head.safetensors
	@echo "bench on MT-bench in the background (log: $(REAL_DIR)/bench-mtbench.log) and on HumanEval here"
	@$(BIN)/acchead-bench $(REAL_BENCH) --prompts mtbench --out $(REAL_DIR)/bench-mtbench \
		> $(REAL_DIR)/bench-mtbench.log 2>&1 & mt=$$!; \
	$(BIN)/acchead-bench $(REAL_BENCH) --prompts humaneval --out $(REAL_DIR)/bench-humaneval; he=$$?; \
	wait $$mt; mtrc=$$?; [ $$mtrc -eq 0 ] || { tail -n 5 $(REAL_DIR)/bench-mtbench.log; exit $$mtrc; }; exit $$he
	@cat $(REAL_DIR)/bench-mtbench/report.md $(REAL_DIR)/bench-humaneval/report.md

# Installs what is missing only (a second run returns at once).
assets: | $(STAMP)
	$(BIN)/acchead-assets

$(REAL_DIR)/data/gen_config.json: | assets
	$(BIN)/acchead-gen-data --pair smollm2 --prompt-set sharegpt-heldout --num-prompts $(REAL_GEN_PROMPTS) \
		--max-new-tokens $(REAL_NEW_TOKENS) --feature-chain $(REAL_FEATURE_CHAIN) --out $(REAL_DIR)/data

$(REAL_DIR)/head/head.safetensors: $(REAL_DIR)/data/gen_config.json
	$(BIN)/acchead-train --data $(REAL_DIR)/data --w-rej 6 --depth 3 --inputs $(REAL_HEAD_INPUTS) \
		--epochs $(REAL_HEAD_EPOCHS) --width $(REAL_HEAD_WIDTH) --out $(REAL_DIR)/head

demo-toy: $(DEMO_DIR)/head/head.safetensors
	$(BIN)/acchead-bench --prompts humaneval --num-prompts $(DEMO_BENCH_PROMPTS) --max-new-tokens $(DEMO_NEW_TOKENS) \
		--head $(DEMO_DIR)/head/head.safetensors --out $(DEMO_DIR)/bench
	@cat $(DEMO_DIR)/bench/report.md

$(DEMO_DIR)/data/gen_config.json: | $(STAMP)
	$(BIN)/acchead-gen-data --num-prompts $(DEMO_GEN_PROMPTS) --max-new-tokens $(DEMO_NEW_TOKENS) --out $(DEMO_DIR)/data

$(DEMO_DIR)/head/head.safetensors: $(DEMO_DIR)/data/gen_config.json
	$(BIN)/acchead-train --data $(DEMO_DIR)/data --out $(DEMO_DIR)/head

pair: $(STAMP)
	$(PY) -m acchead.zoo.demo

# acchead-gpu-check (inference/bench/gpu_check.py); `--help` lists its flags.
GPU_CHECK_ARGS ?=
gpu-check: $(STAMP)
	$(PY) -m acchead.inference.bench.gpu_check --out runs/gpu-check/report.md $(GPU_CHECK_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .
