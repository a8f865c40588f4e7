"""`head.safetensors`: an acceptance head's weights plus everything needed to rebuild and vet it.

A safetensors file carries str -> str metadata, so the whole `HeadMetadata` is JSON-encoded under one key
next to a format tag. Loading checks the tag (so a random safetensors file is refused with one line),
rebuilds the head from the recorded depth and hidden size, and, given the draft it is about to run with,
refuses a head trained on another draft: its features would be meaningless to it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from acchead.errors import AccheadError
from acchead.head import DEFAULT_H, AcceptanceHead
from acchead.sampling import SamplingConfig

FORMAT_TAG = "acchead-head"
FORMAT_VERSION = 1
_META_KEY = "acchead_meta"  # the JSON-encoded HeadMetadata
HEAD_FILENAME = "head.safetensors"


@dataclass
class HeadMetadata:
    """Configuration and provenance of a trained head, stored inside `head.safetensors`.

    Attributes:
        depth: number of residual blocks D of the `AcceptanceHead`.
        hidden_size: input width; equals the draft's hidden size.
        w_acc: BCE weight of the accept term it was trained with.
        w_rej: BCE weight of the reject term it was trained with.
        draft: `acchead.models.model_identity` of the draft whose final hidden states it reads
            (`name`, `hidden_size`, `vocab_size`, `fingerprint`).
        sampling: `SamplingConfig.to_dict()` of the configuration S its labels were computed under; a
            decoder should run with the same S.
        data: gen-data settings (e.g. the dataset's `gen_config.json` minus its counts, the target identity).
        extra: anything else worth keeping (training metrics, lr, epochs, ...). Must be JSON-serialisable.
        kind: "candidate" (the paper's head) or "lookahead" (DESIGN §3.1). Heads written before head kinds
            existed carry none and load as "candidate".
        inputs: what the head reads (`acchead.lookahead.LOOKAHEAD_INPUTS`); ["state"] for a candidate head.
        default_h: the stop threshold `specdecpp` uses with this head when its spec names no `h` (set by
            `acchead-train --default-h`). None in heads written before heads recorded one: they use
            `acchead.head.DEFAULT_H`.
        width: width of the head's residual blocks (`acchead-train --width`); None = `hidden_size` (the
            paper's, and every head written before heads had a width).
    """

    depth: int
    hidden_size: int
    w_acc: float
    w_rej: float
    draft: dict[str, Any]
    sampling: dict[str, Any]
    data: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    kind: str = "candidate"
    inputs: list[str] = field(default_factory=lambda: ["state"])
    default_h: float | None = None
    width: int | None = None

    @property
    def threshold(self) -> float:
        """The recorded default threshold h, or `DEFAULT_H` for a head that records none."""
        return DEFAULT_H if self.default_h is None else float(self.default_h)

    @property
    def sampling_config(self) -> SamplingConfig:
        return SamplingConfig.from_dict(self.sampling)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> HeadMetadata:
        d = json.loads(text)
        if not isinstance(d, dict):
            raise ValueError("metadata is not a JSON object")
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown metadata keys {sorted(unknown)}")
        return cls(**d)


def save_head(head: AcceptanceHead, path: str | Path, *, meta: HeadMetadata) -> Path:
    """Write `head` and `meta` to `path` atomically and durably (tmp file, fsync, rename); returns the path.

    `meta.depth` / `meta.hidden_size` must describe `head`, and a `meta.draft` that names a hidden size
    must agree with it: a file that lies about its head would be refused only much later.
    """
    described = (meta.depth, meta.hidden_size, meta.width or meta.hidden_size, meta.kind, tuple(meta.inputs))
    actual = (head.depth, head.hidden_size, head.width, head.kind, head.inputs)
    if described != actual:
        raise ValueError(
            f"metadata says (depth, hidden_size, width, kind, inputs)={described} but the head has {actual}"
        )
    if meta.default_h is not None and not 0.0 < meta.default_h < 1.0:
        raise ValueError(f"default_h must be in (0, 1), got {meta.default_h}")
    if meta.draft.get("hidden_size", meta.hidden_size) != meta.hidden_size:
        raise ValueError(f"draft hidden size {meta.draft['hidden_size']} != head's {meta.hidden_size}")
    SamplingConfig.from_dict(meta.sampling)  # fail now, not at load time, on a malformed config
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    metadata = {"format": FORMAT_TAG, "version": str(FORMAT_VERSION), _META_KEY: meta.to_json()}
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        save_file(tensors, str(tmp), metadata=metadata)
        from acchead.rundir import commit

        commit(tmp, path)  # fsync, rename, fsync the directory: durable across a power loss too
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_head_metadata(path: str | Path) -> HeadMetadata:
    """The metadata of a head file (or a directory holding `head.safetensors`), without its weights."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / HEAD_FILENAME
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        return HeadMetadata.from_json(metadata[_META_KEY])
    except (SafetensorError, OSError, ValueError, KeyError, TypeError) as e:
        raise AccheadError(f"{path} is not a readable acchead head file ({type(e).__name__}: {e})") from None


def load_head(path: str | Path, *, draft: Any = None) -> tuple[AcceptanceHead, HeadMetadata]:
    """Rebuild the head stored at `path` (a file, or a directory holding `head.safetensors`), in eval mode.

    Args:
        path: the head file.
        draft: optional draft model (a `PreTrainedModel`) or its `model_identity` dict; a head recorded
            for a different hidden size or fingerprint is refused with an AccheadError naming both.
    Returns:
        (the head on CPU in float32, its metadata).
    """
    path = Path(path).expanduser()
    if path.is_dir() and (path / HEAD_FILENAME).is_file():
        path = path / HEAD_FILENAME
    if not path.exists():
        raise AccheadError(f"head file does not exist: {path}")
    if not path.is_file():
        raise AccheadError(f"not a head file (a directory without {HEAD_FILENAME}): {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118  (safe_open is not a dict)
    except (SafetensorError, OSError, ValueError) as e:
        raise AccheadError(f"{path} is not an acchead head file (not a safetensors file: {e})") from None
    if metadata.get("format") != FORMAT_TAG:
        raise AccheadError(f"{path} is a safetensors file but not an acchead head (no {FORMAT_TAG!r} tag)")
    version = metadata.get("version", "?")
    if not version.isdigit() or int(version) > FORMAT_VERSION:
        raise AccheadError(f"{path} is head format version {version}; this acchead reads 1..{FORMAT_VERSION}")
    try:
        meta = HeadMetadata.from_json(metadata[_META_KEY])
        head = AcceptanceHead(
            meta.hidden_size, meta.depth, meta.kind, meta.inputs, meta.threshold, width=meta.width
        )
        head.load_state_dict(tensors, strict=True)
    except (KeyError, TypeError, ValueError, RuntimeError, AccheadError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise AccheadError(f"{path}: corrupt head metadata or weights: {msg}") from None
    bad = sorted(k for k, v in tensors.items() if v.is_floating_point() and not bool(v.isfinite().all()))
    if bad:  # a diverged training run: its predictions would be NaN and every round would stop at random
        raise AccheadError(f"{path}: head weights contain NaN or Inf (in {', '.join(bad)}); retrain the head")
    if draft is not None:
        check_head_matches_draft(meta, draft)
    return head.eval(), meta


def check_head_matches_draft(meta: HeadMetadata, draft: Any) -> None:
    """AccheadError unless the head's recorded draft has `draft`'s hidden size and fingerprint.

    `draft` is a model or a `model_identity` dict. A recorded identity without a fingerprint (hand-made
    metadata) is checked on hidden size only.
    """
    if not isinstance(draft, dict):
        from acchead.models import model_identity  # lazy: `import acchead` must not pull in transformers

        draft = model_identity(draft)
    rec = meta.draft
    rec_name, got_name = rec.get("name", "?"), draft.get("name", "?")
    if meta.hidden_size != draft["hidden_size"]:
        raise AccheadError(
            f"head was trained for draft {rec_name!r} with hidden size {meta.hidden_size}, "
            f"but draft {got_name!r} has hidden size {draft['hidden_size']}"
        )
    if rec.get("fingerprint") and draft.get("fingerprint") and rec["fingerprint"] != draft["fingerprint"]:
        raise AccheadError(
            f"head was trained for draft {rec_name!r} (fingerprint {rec['fingerprint']}), "
            f"but draft {got_name!r} has fingerprint {draft['fingerprint']}: other weights"
        )

