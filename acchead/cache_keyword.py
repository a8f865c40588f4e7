"""The keyword every transformers forward takes its KV cache by, read off the installed release.

transformers 5.24 renamed `past_key_values` to `cache` across all models at once (the old name warns, and
goes in 5.40). `CACHE_ARG` is read off the public signature of one model class, not the version number;
a constant, so a compiled graph sees a plain keyword:

    model(input_ids=ids, **{CACHE_ARG: cache}, use_cache=True)

A module of its own, importing nothing of acchead, so that what `acchead.models` imports at its top (the
draft classes it registers) can use it too; `acchead.models` re-exports it.
"""

from __future__ import annotations

import inspect

from transformers import LlamaModel

CACHE_ARG = "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"
