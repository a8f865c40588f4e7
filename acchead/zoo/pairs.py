"""The versions of the demo pair: each one's LMs (shape and training budget) and what it trains on.

    v1  the pair shipped before issue 21: 6 x 256 target, 2 x 128 draft, stdlib corpus, CPU-sized budgets
    v2  issue 21's: a 21 x 160 target of v1's target's parameter count, the same 2 x 128 draft, the stdlib
        plus a fixed list of installed packages (`acchead.zoo.training_corpus`), H100-sized budgets; the
        shipped pair (built on a CPU with a longer clock: docs/results/pair-v2/build_cpu.sh)

`acchead-build-zoo --pair v1` rebuilds v1 exactly as it was built (same specs, corpus and tokenizer).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from acchead.zoo.arch import Shape


@dataclass
class LMSpec:
    """Architecture and training budget of one demo LM."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    peak_lr: float
    token_budget: int  # stop after this many training tokens ...
    minutes: float  # ... or after this many minutes, whichever first
    batch_size: int = 16  # windows per optimiser step (`--batch-size` overrides)

    def shape(self) -> Shape:
        return Shape(self.num_layers, self.hidden_size, self.num_heads, self.intermediate_size)


@dataclass(frozen=True)
class PairSpec:
    """One version of the demo pair: its three LMs, what they train on, and where its build works."""

    name: str
    target: LMSpec
    draft: LMSpec  # the corpus draft: next-token loss on the corpus, and the distilled draft's start
    distilled_draft: LMSpec  # the shipped draft
    corpus: str  # one of `training_corpus.CORPORA`
    tokenizer_corpus: str  # the corpus the BPE is trained on
    work_dir: Path  # default --work-dir


# Pair v1 (release 0.1-0.2): budgets sized for a 2-core CPU (tokens and minutes as they were built).
DRAFT_V1 = LMSpec("pycode-draft", 128, 2, 2, 768, 2e-3, 4_000_000, 6.0)
TARGET_V1 = LMSpec("pycode-target", 256, 6, 4, 1024, 1e-3, 9_000_000, 38.0)
DISTILLED_DRAFT_V1 = LMSpec("pycode-draft", 128, 2, 2, 768, 1e-3, 60_000_000, 45.0)

# Pair v2 (issue 21). The target: 21 layers x 160 at v1's target's parameter count, the fewest layers at
# which the draft's one-token step dispatches at most 0.12 of the target's operators (136 vs 1,181:
# `acchead-build-zoo --stage arch`, docs/pair.md). Budgets are sized for one H100 in bf16 with batches of
# 64 x 512 tokens: each stage's minutes cap it near ten minutes, its tokens at what ~500k tokens/s would
# reach (an estimate, not a measurement: the eager steps of a 21-layer model this narrow are bound by
# kernel launches, not FLOPs).
TARGET = LMSpec("pycode-target", 160, 21, 2, 448, 1e-3, 300_000_000, 10.0, batch_size=64)
DRAFT = LMSpec("pycode-draft", 128, 2, 2, 768, 2e-3, 100_000_000, 5.0, batch_size=64)
DISTILLED_DRAFT = LMSpec("pycode-draft", 128, 2, 2, 768, 1e-3, 400_000_000, 10.0, batch_size=64)

PAIRS: dict[str, PairSpec] = {
    "v1": PairSpec("v1", TARGET_V1, DRAFT_V1, DISTILLED_DRAFT_V1, "stdlib", "stdlib", Path("work/zoo")),
    "v2": PairSpec("v2", TARGET, DRAFT, DISTILLED_DRAFT, "stdlib+packages", "stdlib", Path("work/zoo-v2")),
}
DEFAULT_PAIR = "v2"
