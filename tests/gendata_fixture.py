"""A small gen-data directory in the on-disk contract format, written directly (no data_gen import).

The "draft" is a tiny random Llama saved beside the data, so the cached features are its real final hidden
states and the on-the-fly mode can recompute them. Labels are a known function of those features,
`P = min(1, 1.25·σ(3·⟨h, w⟩ - 0.3))` for a fixed direction w, so a head can learn them (and a constant can't).
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from acchead.models import final_hidden, model_identity
from acchead.sampling import SamplingConfig


def tiny_draft(path: Path, hidden: int = 32, vocab: int = 128, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path)
    return model


def write_gen_data(
    out: Path,
    draft_dir: Path,
    *,
    prompts: int = 40,
    rows_per_prompt: int = 2,
    hidden: int = 32,
    seed: int = 0,
    cache: bool = True,
) -> dict:
    """Write `out/` (dataset, gen_config.json, features.npy if `cache`) and the draft to `draft_dir`.

    Returns the gen_config dict.
    """
    draft = tiny_draft(draft_dir, hidden=hidden, seed=seed)
    vocab = draft.config.vocab_size
    rng = np.random.default_rng(seed)
    direction = rng.standard_normal(hidden)
    direction /= np.linalg.norm(direction)
    cols: dict[str, list] = {
        k: []
        for k in (
            "prompt_index",
            "prompt_ids",
            "response_ids",
            "draft_ids",
            "mixed_ids",
            "from_draft",
            "accept_prob",
            "feature_offset",
        )
    }
    feats: list[np.ndarray] = []
    offset = 0
    for r in range(prompts * rows_per_prompt):
        prompt = rng.integers(0, vocab, rng.integers(3, 9))
        n = int(rng.integers(8, 25))
        x, y = rng.integers(0, vocab, n), rng.integers(0, vocab, n)
        from_draft = rng.random(n) >= 0.15
        z = np.where(from_draft, y, x)
        ids = torch.from_numpy(np.concatenate([prompt, z])).long()[None]
        with torch.no_grad():
            h = final_hidden(draft(input_ids=ids, output_hidden_states=True))[0, len(prompt) :].numpy()
        probs = np.minimum(1.0, 1.25 / (1 + np.exp(-(3 * h @ direction - 0.3))))
        feats.append(h[from_draft])
        cols["prompt_index"].append(r // rows_per_prompt)
        cols["prompt_ids"].append(prompt.tolist())
        cols["response_ids"].append(x.tolist())
        cols["draft_ids"].append(y.tolist())
        cols["mixed_ids"].append(z.tolist())
        cols["from_draft"].append(from_draft.tolist())
        cols["accept_prob"].append(probs.astype(np.float32).tolist())
        cols["feature_offset"].append(offset if cache and from_draft.any() else -1)
        offset += int(from_draft.sum())
    schema = datasets.Features(
        {
            "prompt_index": datasets.Value("int64"),
            **{
                k: datasets.Sequence(datasets.Value("int32"))
                for k in ("prompt_ids", "response_ids", "draft_ids", "mixed_ids")
            },
            "from_draft": datasets.Sequence(datasets.Value("bool")),
            "accept_prob": datasets.Sequence(datasets.Value("float32")),
            "feature_offset": datasets.Value("int64"),
        }
    )
    datasets.Dataset.from_dict(cols, features=schema).save_to_disk(str(out))
    ident = model_identity(draft)
    labels = np.concatenate(
        [np.asarray(p)[np.asarray(f)] for p, f in zip(cols["accept_prob"], cols["from_draft"], strict=True)]
    )
    cfg = {
        "format": "acchead-gen-data",
        "version": 1,
        "target": {"name": "fake-target", "hidden_size": 64, "vocab_size": vocab, "fingerprint": "0" * 16},
        "draft": ident,
        "sampling": SamplingConfig(temperature=1.0).to_dict(),
        "mix_ratio": 0.15,
        "seed": seed,
        "max_new_tokens": 24,
        "prompts": {"source": "synthetic"},
        "counts": {
            "rows": len(cols["prompt_index"]),
            "positions": sum(map(len, cols["from_draft"])),
            "draft_positions": offset,
            "mean_label": float(labels.mean()),
            "share_label_one": float((labels >= 1).mean()),
        },
        "features": None,
    }
    if cache:
        arr = np.concatenate(feats).astype(np.float16)
        np.save(out / "features.npy", arr)
        cfg["features"] = {
            "file": "features.npy",
            "dtype": "float16",
            "shape": list(arr.shape),
            "draft": ident,
        }
    (out / "gen_config.json").write_text(json.dumps(cfg, indent=1))
    return cfg


@pytest.fixture(scope="session")
def gen_data(tmp_path_factory) -> dict[str, Path]:
    """Session-wide fixture data: `{"data": cached gen-data dir, "draft": its tiny draft's dir}`."""
    root = tmp_path_factory.mktemp("gendata")
    write_gen_data(root / "data", root / "draft")
    return {"data": root / "data", "draft": root / "draft", "root": root}


def direct_val_metrics(
    data_dir: Path, head_path: Path, w_rej: float, val_fraction: float = 0.1, seed: int = 0
) -> dict:
    """Validation metrics of a saved head computed in one process, without torchmetrics or Lightning.

    The reference the trainer's (possibly multi-process) torchmetrics values must reproduce.
    """
    from acchead.head_io import load_head
    from acchead.loss import binary_kl, weighted_bce_with_logits
    from acchead.train.data import load_gen_data, split_by_prompt

    data = load_gen_data(data_dir, "cached")
    val = split_by_prompt(data.prompt_index, val_fraction, seed)[data.row]
    head, _ = load_head(head_path)
    feats = torch.from_numpy(np.asarray(data.features[data.feature_index[val]]))
    labels = torch.from_numpy(data.labels[val])
    hard = data.hard[val]
    with torch.no_grad():
        logits = head(feats)
    probs = torch.sigmoid(logits).numpy()
    # AUROC by the rank-sum (Mann-Whitney) formula; ties count one half.
    pos, neg = probs[hard], probs[~hard]
    wins = (pos[:, None] > neg[None]).sum() + 0.5 * (pos[:, None] == neg[None]).sum()
    auroc = wins / (len(pos) * len(neg))
    return {
        "kl": binary_kl(labels, logits).mean().item(),
        "weighted_bce": weighted_bce_with_logits(logits, labels, w_rej=w_rej).item(),
        "brier": float(((probs - labels.numpy()) ** 2).mean()),
        "auroc": float(auroc),
        "positions": int(val.sum()),
    }
