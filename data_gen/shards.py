"""Resumable, sharded output of a gen-data run, and its final merge into the on-disk format.

The format itself is described in the README, section "The gen-data format".

Layout of OUT while a run is in progress and after it:

    gen_run.json          manifest: the run's settings and their hash; written before any work
    shards/shard-00007.arrow, shard-00007.npy    one shard (rows; features when cached), each file atomic
    data-*.arrow, dataset_info.json, state.json  the final `datasets` dataset (after the merge)
    features.npy          float16 (P, H) feature cache (after the merge)
    gen_config.json       written last: its presence means the run is complete

A shard is a fixed range of prompt indices, `[k * shard_size, (k + 1) * shard_size)`, and its batches are
fixed by the prompts' lengths (`plan_batches`), so a shard's content does not depend on which process
computes it or whether the run was interrupted. A shard exists iff its `.arrow` file does; the `.npy` is
written first, so a kill between the two leaves only a file that is rewritten. A rerun computes only the
missing shards. A different run's OUT (another settings hash) is refused, never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from acchead.errors import AccheadError
from data_gen.labeler import LabeledRow

FORMAT, VERSION = "acchead-gen-data", 1
MANIFEST, GEN_CONFIG, FEATURES, SHARD_DIR = "gen_run.json", "gen_config.json", "features.npy", "shards"

SHARD_SCHEMA = pa.schema(
    [
        ("prompt_index", pa.int64()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("draft_ids", pa.list_(pa.int32())),
        ("mixed_ids", pa.list_(pa.int32())),
        ("from_draft", pa.list_(pa.bool_())),
        ("accept_prob", pa.list_(pa.float32())),
    ]
)


def settings_hash(settings: dict) -> str:
    """sha256 (16 hex digits) of the canonical JSON of a run's settings."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def plan_shards(kept: list[int], num_prompts: int, shard_size: int) -> list[list[int]]:
    """Indices in `kept` grouped by shard; shard k covers [k * shard_size, (k + 1) * shard_size)."""
    shards: list[list[int]] = [[] for _ in range(-(-num_prompts // shard_size))]
    for i in kept:
        shards[i // shard_size].append(i)
    return shards


def plan_batches(indices: list[int], lengths: list[int], batch_size: int) -> list[list[int]]:
    """Batches of prompts of similar length (sorted by length, then index) to keep left padding small."""
    order = sorted(indices, key=lambda i: (lengths[i], i))
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]


def _atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Write via a temporary sibling then rename, so `path` is either absent or complete."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: Path, obj: dict) -> None:
    """Atomic, pretty JSON."""
    _atomic(path, lambda p: p.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n"))


class RunDir:
    """The output directory of one run, identified by its settings.

    Args:
        out: output directory.
        settings: everything that determines the data (models, S, r, seed, prompts, batching, ...).
        num_shards: number of shards of the run.
    """

    def __init__(self, out: str | Path, settings: dict, num_shards: int) -> None:
        self.out = Path(out)
        self.settings = {**settings, "num_shards": num_shards}
        self.hash = settings_hash(self.settings)
        self.num_shards = num_shards
        self.shard_dir = self.out / SHARD_DIR

    def status(self) -> str:
        """ "new", "resume" or "complete"; AccheadError if OUT holds anything but this run. Read-only."""
        manifest = self.out / MANIFEST
        if not manifest.exists():
            if self.out.exists() and (not self.out.is_dir() or any(self.out.iterdir())):
                raise AccheadError(
                    f"{self.out} is not empty and holds no gen-data run; refusing to write into it"
                )
            return "new"
        try:
            old = json.loads(manifest.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise AccheadError(f"{manifest} is unreadable ({e}); refusing to write into {self.out}") from e
        if old.get("settings_hash") != self.hash:
            prev = old.get("settings", {})
            diff = sorted(k for k in set(prev) | set(self.settings) if prev.get(k) != self.settings.get(k))
            raise AccheadError(
                f"{self.out} holds a different gen-data run (differs in: {', '.join(diff) or 'format'}); "
                "use another --out or delete it"
            )
        return "complete" if (self.out / GEN_CONFIG).exists() else "resume"

    def start(self) -> None:
        """Create OUT and the manifest (main process only; idempotent)."""
        self.shard_dir.mkdir(parents=True, exist_ok=True)
        if not (self.out / MANIFEST).exists():
            manifest = {
                "format": FORMAT,
                "version": VERSION,
                "settings_hash": self.hash,
                "settings": self.settings,
            }
            write_json(self.out / MANIFEST, manifest)

    def shard_path(self, k: int, suffix: str = ".arrow") -> Path:
        return self.shard_dir / f"shard-{k:05d}{suffix}"

    def pending(self) -> list[int]:
        """Shards not yet written, in order."""
        return [k for k in range(self.num_shards) if not self.shard_path(k).exists()]

    def write_shard(self, k: int, rows: list[LabeledRow], hidden_size: int | None) -> None:
        """Write shard k: features (if `hidden_size`) first, then the rows file that marks it done."""
        rows = sorted(rows, key=lambda r: r.prompt_index)
        if hidden_size is not None:
            feats = [r.features for r in rows if r.features is not None]
            arr = np.concatenate(feats) if feats else np.zeros((0, hidden_size), np.float16)

            def save_npy(p: Path) -> None:
                with open(p, "wb") as f:
                    np.save(f, arr.astype(np.float16, copy=False))

            _atomic(self.shard_path(k, ".npy"), save_npy)
        table = pa.Table.from_pydict(
            {name: [getattr(r, name) for r in rows] for name in SHARD_SCHEMA.names}, schema=SHARD_SCHEMA
        )

        def save_arrow(p: Path) -> None:
            # Arrow IPC stream: the format `datasets.Dataset.from_file` memory-maps.
            with pa.OSFile(str(p), "wb") as sink, pa.ipc.new_stream(sink, SHARD_SCHEMA) as writer:
                writer.write_table(table)

        _atomic(self.shard_path(k), save_arrow)

    def merge(self, gen_config: dict, hidden_size: int | None) -> dict:
        """Concatenate the shards into the final dataset (+ features.npy), write gen_config.json.

        Args:
            gen_config: the contract's gen_config fields except "counts" and "features".
            hidden_size: the draft's H when features are cached, else None.

        Returns:
            the gen_config written, with counts and features filled in.
        """
        import datasets

        missing = self.pending()
        if missing:
            raise AccheadError(f"cannot merge: {len(missing)} shards missing (first: {missing[0]})")
        parts = [datasets.Dataset.from_file(str(self.shard_path(k))) for k in range(self.num_shards)]
        ds = datasets.concatenate_datasets(parts)
        per_row, labels = _row_stats(ds.data.table)
        cached = hidden_size is not None
        offsets = np.cumsum(per_row) - per_row if cached else np.full(len(per_row), -1)
        ds = ds.add_column("feature_offset", offsets.astype(np.int64), feature=datasets.Value("int64"))

        features = None
        if cached:
            total = int(per_row.sum())
            _atomic(self.out / FEATURES, lambda p: self._merge_features(p, total, hidden_size))
            features = {"file": FEATURES, "dtype": "float16", "shape": [total, hidden_size]}
            features["draft"] = gen_config["draft"]

        tmp = self.out / ".merge"
        shutil.rmtree(tmp, ignore_errors=True)
        ds.save_to_disk(str(tmp))
        for stale in self.out.glob("data-*.arrow"):
            stale.unlink()
        for f in tmp.iterdir():
            os.replace(f, self.out / f.name)
        tmp.rmdir()

        counts = {
            "rows": len(ds),
            "positions": int(labels.size),
            "draft_positions": int(per_row.sum()),
            "mean_label": float(labels.mean()) if labels.size else 0.0,
            "share_label_one": float((labels >= 1.0).mean()) if labels.size else 0.0,
        }
        gen_config = {
            "format": FORMAT,
            "version": VERSION,
            **gen_config,
            "counts": counts,
            "features": features,
        }
        write_json(self.out / GEN_CONFIG, gen_config)
        shutil.rmtree(self.shard_dir, ignore_errors=True)  # the dataset now holds everything
        return gen_config

    def _merge_features(self, path: Path, total: int, hidden_size: int) -> None:
        """Stream the shards' features into one (total, H) float16 .npy without holding them in memory."""
        out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(total, hidden_size))
        row = 0
        for k in range(self.num_shards):
            part = np.load(self.shard_path(k, ".npy"), mmap_mode="r")
            out[row : row + len(part)] = part
            row += len(part)
        if row != total:
            raise AccheadError(f"feature shards hold {row} rows, the dataset {total} draft positions")
        out.flush()
        del out

    def load_gen_config(self) -> dict:
        return json.loads((self.out / GEN_CONFIG).read_text())


def _row_stats(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(from-draft positions per row (R,), all accept_prob labels flattened (positions,))."""
    fd = table.column("from_draft")
    lengths = pc.list_value_length(fd).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(fd).to_numpy(zero_copy_only=False).astype(np.int64)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    csum = np.concatenate([[0], np.cumsum(flat)])
    per_row = csum[bounds[1:]] - csum[bounds[:-1]]
    labels = pc.list_flatten(table.column("accept_prob")).to_numpy(zero_copy_only=False)
    return per_row, np.asarray(labels, dtype=np.float32)
