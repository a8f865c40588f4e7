"""The embedded demo pair (pycode-draft, pycode-target), its shipped heads, and named prompt sets.

Shipped heads live in `heads/<name>/head.safetensors`, one directory per (sampling configuration S, head
kind); `heads/defaults.json` maps each S (its `str`, e.g. "greedy") to the head a decoder uses by default.
"""

from __future__ import annotations

import json
from pathlib import Path

ZOO_DIR = Path(__file__).resolve().parent
DRAFT_DIR = ZOO_DIR / "pycode-draft"
TARGET_DIR = ZOO_DIR / "pycode-target"
HEADS_DIR = ZOO_DIR / "heads"
DEFAULTS_FILE = HEADS_DIR / "defaults.json"


def shipped_heads(sampling=None) -> list[Path]:
    """Every shipped head file, sorted by directory name; with `sampling` (a `SamplingConfig`), only the
    heads whose labels were computed under that S."""
    from acchead.head_io import read_head_metadata

    paths = sorted(HEADS_DIR.glob("*/head.safetensors"))
    if sampling is None:
        return paths
    return [p for p in paths if read_head_metadata(p).sampling_config == sampling]


def default_head(sampling) -> Path | None:
    """The shipped head a decoder uses by default under S (`SamplingConfig`), or None if none matches.

    `defaults.json` names one per shipped S; an S it does not name falls back to the first shipped head
    trained under that S, else None (the caller then warns and uses the greedy default, or needs --head).
    """
    if DEFAULTS_FILE.is_file():
        name = json.loads(DEFAULTS_FILE.read_text()).get(str(sampling))
        if name and (HEADS_DIR / name / "head.safetensors").is_file():
            return HEADS_DIR / name / "head.safetensors"
    matches = shipped_heads(sampling)
    return matches[0] if matches else None


def fallback_head() -> Path:
    """The head used when no shipped head matches the requested S: the greedy default."""
    from acchead.sampling import SamplingConfig

    head = default_head(SamplingConfig(0.0))
    if head is None:
        raise FileNotFoundError(f"no shipped head in {HEADS_DIR}")
    return head


def demo_head_for(draft, sampling) -> Path | None:
    """The shipped head to use under S (`SamplingConfig`) when `draft` is the demo draft, else None.

    Lets a Python caller write `SpeculativeDecoder(target, draft, policy="specdecpp")` on the demo pair, as
    the CLIs do: the head is chosen only when its recorded draft fingerprint is `draft`'s (a head is never
    guessed for another draft). An S with no shipped head falls back to the greedy default, which the
    decoder then warns about.
    """
    from acchead.head_io import read_head_metadata
    from acchead.models import model_identity
    from acchead.sampling import SamplingConfig

    head = default_head(sampling) or default_head(SamplingConfig(0.0))
    if head is None:
        return None
    recorded = read_head_metadata(head).draft.get("fingerprint")
    return head if recorded and recorded == model_identity(draft)["fingerprint"] else None
