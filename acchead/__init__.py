"""acchead: SpecDec++ acceptance-prediction heads.

The public core: the head, its file format, the sampling configuration S, and the one error type.
Model loading lives in `acchead.models` (kept out of this namespace so `import acchead` stays light).
"""

from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.head_io import HeadMetadata, load_head, save_head
from acchead.sampling import SamplingConfig

__all__ = ["AcceptanceHead", "AccheadError", "HeadMetadata", "SamplingConfig", "load_head", "save_head"]
