"""acchead: SpecDec++ acceptance-prediction heads.

The public core: the head, its file format, the sampling configuration S, and the one error type.
Model loading lives in `acchead.models` (kept out of this namespace so `import acchead` stays light).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from acchead.errors import AccheadError
from acchead.sampling import SamplingConfig

if TYPE_CHECKING:
    from acchead.head import AcceptanceHead
    from acchead.head_io import HeadMetadata, load_head, save_head

__all__ = ["AcceptanceHead", "AccheadError", "HeadMetadata", "SamplingConfig", "load_head", "save_head"]


# The torch-backed names load on first use (PEP 562): the console scripts import `acchead.<stage>`, which
# runs this file, and their `--help` must not wait for torch.
def __getattr__(name: str) -> object:
    if name == "AcceptanceHead":
        from acchead import head as module
    elif name in ("HeadMetadata", "load_head", "save_head"):
        from acchead import head_io as module
    else:
        raise AttributeError(f"module 'acchead' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
