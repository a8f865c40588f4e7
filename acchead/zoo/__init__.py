"""The demo pair's builder (pycode-draft, pycode-target), its shipped heads, and named prompt sets.

Where the shipped files are and which head is the default under an S is `acchead.demo_pair`, a core module
the commands read without importing this package (issue 31); the names are re-exported here for the
builder and for existing callers. Shipped heads live in `heads/<name>/head.safetensors`, one directory per
(sampling configuration S, head kind); `heads/defaults.json` maps each S (its `str`, e.g. "greedy") to the
default head.
"""

from __future__ import annotations

from acchead.demo_pair import (
    DEFAULTS_FILE,
    DRAFT_DIR,
    HEADS_DIR,
    TARGET_DIR,
    ZOO_DIR,
    default_head,
    fallback_head,
    head_for,
    shipped_heads,
)

__all__ = [
    "DEFAULTS_FILE",
    "DRAFT_DIR",
    "HEADS_DIR",
    "TARGET_DIR",
    "ZOO_DIR",
    "default_head",
    "fallback_head",
    "head_for",
    "shipped_heads",
]
