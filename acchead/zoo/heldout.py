"""Scoring a demo LM on the held-out corpus: next-token loss, top-1 accuracy, and bits per byte.

Loss in nats per token compares models that share a tokenizer (v1's target: 3.327 on the 40 held-out stdlib
files); bits per byte compares across tokenizers, since a token's bytes are fixed by the byte-level BPE.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


def token_bytes(tok) -> np.ndarray:
    """(vocab,) UTF-8 bytes each token stands for (byte-level BPE: one character per byte; specials 0)."""
    import numpy as np

    special = set(tok.all_special_ids)
    return np.asarray([0 if i in special else len(t) for i, t in
                       enumerate(tok.convert_ids_to_tokens(list(range(len(tok)))))], dtype=np.int64)


def evaluate(model, ids: np.ndarray, seq_len: int, max_tokens: int,
             bytes_per_id: np.ndarray | None = None) -> dict[str, float]:
    """Mean next-token loss and top-1 accuracy over non-overlapping windows of held-out ids; with
    `bytes_per_id` (`token_bytes`), also bits per byte (comparable across tokenizers)."""
    import numpy as np
    import torch

    model.eval()
    device = next(model.parameters()).device
    n = min(len(ids) // (seq_len + 1), max(1, max_tokens // seq_len))
    tot_loss, tot_correct, tot, tot_bytes = 0.0, 0, 0, 0
    with torch.no_grad():
        for i in range(n):
            window = ids[i * (seq_len + 1) : (i + 1) * (seq_len + 1)].astype(np.int64)
            w = torch.from_numpy(window)[None].to(device)
            logits = model(w[:, :-1]).logits[0].float()  # (seq_len, vocab)
            tgt = w[0, 1:]
            tot_loss += torch.nn.functional.cross_entropy(logits, tgt, reduction="sum").item()
            tot_correct += (logits.argmax(-1) == tgt).sum().item()
            tot += tgt.numel()
            if bytes_per_id is not None:
                tot_bytes += int(bytes_per_id[window[1:]].sum())
    model.train()
    out = {"loss": tot_loss / tot, "accuracy": tot_correct / tot, "tokens": tot}
    if bytes_per_id is not None:
        out["bits_per_byte"] = tot_loss / math.log(2) / max(1, tot_bytes)
    return out
