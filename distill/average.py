"""`acchead-distill average`: a weighted average of drafts' weights (a "model soup").

Drafts fine-tuned one after another from the same start (runs 11 and 12 of the real pair's draft, each on
new response shards) sit in one basin: the average of their weights can agree with the target more often
than either, at no training cost (Wortsman et al., *Model soups*, 2022). Only drafts of one architecture
and one vocabulary average: the same config, the same parameter names and shapes, and the same
reduced-vocabulary maps (`lm_head.to_full`: averaging head rows of different tokens is meaningless).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from acchead.errors import AccheadError

# config keys that may differ between drafts of one architecture (where they were saved from, in what dtype)
_IGNORED_CONFIG_KEYS = frozenset({"_name_or_path", "dtype", "torch_dtype", "transformers_version"})
# what `train --init` reads of a draft's training.json to go on with its schedule
_SCHEDULE_KEYS = frozenset({"config", "epoch", "position", "seconds", "step", "tokens"})


def _weights(drafts: list[Path], weights: list[float] | None) -> list[float]:
    if len(drafts) < 2:
        raise AccheadError(f"--drafts: give two drafts or more to average (got {len(drafts)})")
    if weights is None:
        return [1.0 / len(drafts)] * len(drafts)
    if len(weights) != len(drafts) or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise AccheadError(
            f"--weights: one weight >= 0 per draft, not all 0 (got {weights} for {len(drafts)} drafts)"
        )
    return [w / sum(weights) for w in weights]


def _config(model) -> dict:
    return {k: v for k, v in model.config.to_dict().items() if k not in _IGNORED_CONFIG_KEYS}


def average_drafts(drafts: list[Path], weights: list[float] | None = None):
    """The first draft, loaded, with every floating-point parameter and buffer replaced by the weighted
    average over `drafts` (computed in float32; `weights` default to uniform and are normalised to sum 1);
    integer buffers (the vocabulary maps) must be equal in all and are kept. Returns (model, weights)."""
    from acchead.models import load_causal_lm

    weights = _weights(drafts, weights)
    first = load_causal_lm(drafts[0])
    base = first.state_dict()
    total = {k: v.float() * weights[0] for k, v in base.items() if v.is_floating_point()}
    for path, w in zip(drafts[1:], weights[1:], strict=True):
        other = load_causal_lm(path)
        if _config(other) != _config(first):
            raise AccheadError(f"--drafts: {path} is not {drafts[0]}'s architecture (their configs differ)")
        state = other.state_dict()
        if state.keys() != base.keys() or any(state[k].shape != base[k].shape for k in base):
            raise AccheadError(f"--drafts: {path}'s parameters are not {drafts[0]}'s (names or shapes)")
        for k, v in state.items():
            if k in total:
                total[k] += v.float() * w
            elif not torch.equal(v, base[k]):
                raise AccheadError(f"--drafts: {path} differs from {drafts[0]} in {k} (another vocabulary)")
        del other
    first.load_state_dict({**base, **{k: v.to(base[k].dtype) for k, v in total.items()}})
    return first, weights


def training_record(drafts: list[Path], weights: list[float]) -> dict:
    """The averaged draft's `training.json`: the last draft's schedule (so a later `train --init` continues
    its token count; its held-out agreement was another model's and is left out), with what was averaged:
    each draft's path, weight and own training record."""
    from acchead.distill.draft import TRAINING_FILE

    def record(path: Path) -> dict:
        f = path / TRAINING_FILE
        return json.loads(f.read_text()) if f.is_file() else {}

    parts = [
        {"draft": str(p), "weight": round(w, 6), "training": record(p)}
        for p, w in zip(drafts, weights, strict=True)
    ]
    schedule = {k: v for k, v in parts[-1]["training"].items() if k in _SCHEDULE_KEYS}  # not its metrics
    return {**schedule, "averaged_from": parts}
