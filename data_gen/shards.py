"""Resumable, sharded output of a gen-data run, and its final merge into the on-disk format.

The format itself is described in the README, section "The gen-data format".

Layout of OUT while a run is in progress and after it:

    gen_run.json          manifest (`acchead.rundir`): the run's settings and their hash; written first
    shards/part-000012-000015.arrow, .npy, .la.npy
                          one part: batches 12..14 (rows; both kinds' features when cached), each atomic
    data-*.arrow, dataset_info.json, state.json  the final `datasets` dataset (after the merge)
    features.npy          float16 (P, H) candidate-head feature cache (after the merge)
    lookahead_features.npy, token_embeddings.npy   the lookahead head's cache (after the merge)
    gen_config.json       written last: its presence means the run is complete

Batches are planned once over the whole run (`plan_batches`: all kept prompts sorted by length, then index),
so a batch's composition, and with it the float rounding of its labels and features, never depends on when
rows are written, on `--shard-size`, on the number of processes or on interruptions. Labelled batches are
written as *parts*: `shards/part-<first>-<end>.arrow` (+ `.npy` feature files) holds the rows of batches
[first, end), written as soon as `--shard-size` prompts or `--flush-seconds` seconds have accumulated,
whichever comes first (`acchead.data_gen.part_writer`), so a kill loses at most about that much work at any
run size. A part exists iff its `.arrow` file does (written last; every file fsynced, then renamed). A rerun
checks every part (rows, prompt indices, feature shapes), deletes a corrupt one (a truncated file left by a
crash or a power loss) and relabels only the batches no valid part holds. The merge puts rows back in prompt
order. The directory is locked for the run (`acchead.rundir.DirLock`); another run's OUT is refused, never
overwritten, unless `--overwrite` is given.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from acchead.data_gen.labeler import LabeledRow
from acchead.errors import AccheadError
from acchead.rundir import (
    DirLock,
    atomic_write,
    claim,
    commit,
    mark_complete,
    refuse_foreign,
    remove_stale_tmp,
    start,
)

FORMAT, VERSION = "acchead-gen-data", 1
KIND = "gen-data"  # the run kind of its manifest (`acchead.rundir`)
MANIFEST, GEN_CONFIG, FEATURES, SHARD_DIR = "gen_run.json", "gen_config.json", "features.npy", "shards"
# The lookahead head's inputs (DESIGN §3.1): states before every response position, and the draft's output
# embedding (V, H) float32, from which training rebuilds the candidate's logits, log q and entropy.
LOOKAHEAD_FEATURES, LOOKAHEAD_SUFFIX = "lookahead_features.npy", ".la.npy"
TOKEN_EMBEDDINGS = "token_embeddings.npy"

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


def plan_batches(
    indices: list[int], lengths: Sequence[int] | Mapping[int, int], batch_size: int
) -> list[list[int]]:
    """Batches of prompts of similar length (sorted by length, then index) to keep padding small.

    `lengths[i]` is prompt i's length (prompt + response when labelling given responses). gen-data plans
    them once over all the run's prompts: what is batched together fixes the rounding.
    """
    order = sorted(indices, key=lambda i: (lengths[i], i))
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]


def _atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Write via a temporary sibling, fsync, rename: `path` is absent or complete, even after a power loss."""
    atomic_write(path, write)


def write_npy(path: Path, arr: np.ndarray) -> None:
    """Atomic .npy."""

    def save(p: Path) -> None:
        with open(p, "wb") as f:
            np.save(f, arr)

    _atomic(path, save)


def write_json(path: Path, obj: dict) -> None:
    """Atomic, pretty JSON."""
    _atomic(path, lambda p: p.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n"))


Part = tuple[int, int]  # batches [first, end) of one part file


class RunDir:
    """The output directory of one run, identified by its settings.

    Args:
        out: output directory.
        settings: everything that determines the data (models, S, r, seed, prompts, batch size, ...).
        batches: the run's batches (prompt indices), planned over all its prompts (`plan_batches`).
    """

    def __init__(self, out: str | Path, settings: dict, batches: list[list[int]]) -> None:
        self.out = Path(out)
        self.settings = {**settings, "num_batches": len(batches)}
        self.hash = settings_hash(self.settings)
        self.batches = batches
        self.num_batches = len(batches)
        self.shard_dir = self.out / SHARD_DIR

    def status(self) -> str:
        """ "new", "resume" or "complete"; AccheadError if OUT holds anything but this run. Read-only."""
        return claim(self.out, KIND, self.settings)

    @contextlib.contextmanager
    def locked(self, state: Any, *, overwrite: bool = False, prog: str = "acchead-gen-data"):
        """Hold OUT's lock for the run (the main process), after claiming it and checking its parts.

        The main process refuses another run's OUT (or empties it with `overwrite`), removes temporary
        files of killed writes and corrupt parts; every process then raises the same one-line error if
        that failed, so none waits forever at a barrier.
        """
        lock, error = None, None
        if state.is_main_process:
            try:
                refuse_foreign(self.out, KIND, overwrite=overwrite)
                lock = DirLock(self.out, prog).acquire()
                claim(self.out, KIND, self.settings, overwrite=overwrite)
                for d in (self.out, self.shard_dir):
                    remove_stale_tmp(d)
                self.drop_corrupt_parts()
            except AccheadError as e:
                error = str(e)
        if state.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            box = [error]
            broadcast_object_list(box, from_process=0)
            error = box[0]
        try:
            if error is not None:
                raise AccheadError(error)
            yield
        finally:
            if lock is not None:
                lock.release()

    def start(self) -> None:
        """Create OUT, the shard directory and the manifest (main process only; idempotent)."""
        self.shard_dir.mkdir(parents=True, exist_ok=True)
        if not (self.out / MANIFEST).exists():
            start(self.out, KIND, self.settings)

    def shard_path(self, k: Part, suffix: str = ".arrow") -> Path:
        return self.shard_dir / f"part-{k[0]:06d}-{k[1]:06d}{suffix}"

    def parts(self) -> list[Part]:
        """The parts on disk (their .arrow file exists), by first batch."""
        found = []
        for p in self.shard_dir.glob("part-*.arrow") if self.shard_dir.is_dir() else []:
            m = re.fullmatch(r"part-(\d{6})-(\d{6})\.arrow", p.name)
            if m and 0 <= int(m[1]) < int(m[2]) <= self.num_batches:
                found.append((int(m[1]), int(m[2])))
        return sorted(found)

    def pending(self) -> list[int]:
        """Batches that no part holds yet, in order."""
        done = {b for first, end in self.parts() for b in range(first, end)}
        return [b for b in range(self.num_batches) if b not in done]

    def drop_corrupt_parts(self) -> list[Part]:
        """Delete the parts that do not hold exactly their batches' rows (and features); returns them.

        A crash or power loss can leave a truncated or empty file where a part was being written; its
        batches become pending again and are relabelled. Feature files without their .arrow go too.
        """
        bad = [k for k in self.parts() if not self._part_ok(k)]
        kept = {self.shard_path(k, "") for k in self.parts() if k not in bad}
        for k in bad:
            print(f"gen-data: relabelling {self.shard_path(k).name}: corrupt or incomplete", file=sys.stderr)
        for p in self.shard_dir.glob("part-*") if self.shard_dir.is_dir() else []:
            stem = p.with_name(p.name.split(".", 1)[0])
            if stem not in kept:
                p.unlink(missing_ok=True)
        return bad

    def _feature_files(self) -> dict[str, Callable[[pa.Table], int]]:
        """Feature file suffix -> the number of rows it must hold for a part's table."""
        if not self.settings.get("cache_features"):
            return {}
        files: dict[str, Callable[[pa.Table], int]] = {".npy": lambda t: int(_row_stats(t)[0].sum())}
        if "lookahead" in self.settings.get("feature_kinds", []):
            files[LOOKAHEAD_SUFFIX] = lambda t: int(_row_stats(t)[1].size)
        return files

    def _part_ok(self, k: Part) -> bool:
        try:
            with pa.OSFile(str(self.shard_path(k)), "rb") as source:
                table = pa.ipc.open_stream(source).read_all()
            expected = sorted(i for b in range(*k) for i in self.batches[b])
            if not table.schema.equals(SHARD_SCHEMA) or table.column("prompt_index").to_pylist() != expected:
                return False
            hidden = self.settings["draft"]["hidden_size"]
            for suffix, rows in self._feature_files().items():
                arr = np.load(self.shard_path(k, suffix), mmap_mode="r")
                if arr.dtype != np.float16 or arr.shape != (rows(table), hidden):
                    return False
        except (OSError, ValueError, EOFError, pa.ArrowException):
            return False
        return True

    def write_shard(self, k: Part, rows: list[LabeledRow], hidden_size: int | None) -> None:
        """Write shard k: features of both head kinds (if `hidden_size`) first, then the rows file that
        marks it done."""
        rows = sorted(rows, key=lambda r: r.prompt_index)
        if hidden_size is not None:
            for attr, suffix in (("features", ".npy"), ("lookahead_features", LOOKAHEAD_SUFFIX)):
                feats = [getattr(r, attr) for r in rows if getattr(r, attr) is not None]
                arr = np.concatenate(feats) if feats else np.zeros((0, hidden_size), np.float16)

                def save_npy(p: Path, arr: np.ndarray = arr) -> None:
                    with open(p, "wb") as f:
                        np.save(f, arr.astype(np.float16, copy=False))

                _atomic(self.shard_path(k, suffix), save_npy)
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
            raise AccheadError(f"cannot merge: {len(missing)} batches missing (first: {missing[0]})")
        parts = [datasets.Dataset.from_file(str(self.shard_path(k))) for k in self.parts()]
        ds = datasets.concatenate_datasets(parts)
        # Parts follow the batch plan (rows by length); the dataset lists rows by prompt index. Features are
        # moved the same way (`_merge_features`), each row's block staying contiguous.
        per_row, labels = _row_stats(ds.data.table)
        lengths = pc.list_value_length(ds.data.table.column("from_draft")).to_numpy(zero_copy_only=False)
        order = np.argsort(np.asarray(ds.data.table.column("prompt_index")), kind="stable")
        self._layout = {".npy": (per_row, order), LOOKAHEAD_SUFFIX: (lengths.astype(np.int64), order)}
        ds = ds.select(order)
        per_row = per_row[order]
        cached = hidden_size is not None
        offsets = np.cumsum(per_row) - per_row if cached else np.full(len(per_row), -1)
        ds = ds.add_column("feature_offset", offsets.astype(np.int64), feature=datasets.Value("int64"))

        features = lookahead = None
        if cached:
            total = int(per_row.sum())
            _atomic(self.out / FEATURES, lambda p: self._merge_features(p, total, hidden_size))
            features = {"file": FEATURES, "dtype": "float16", "shape": [total, hidden_size]}
            features["draft"] = gen_config["draft"]
            # Lookahead states: one per response position, rows in dataset order (no offsets needed).
            n_pos = int(labels.size)
            _atomic(self.out / LOOKAHEAD_FEATURES,
                    lambda p: self._merge_features(p, n_pos, hidden_size, LOOKAHEAD_SUFFIX))
            lookahead = {"file": LOOKAHEAD_FEATURES, "dtype": "float16", "shape": [n_pos, hidden_size],
                         "draft": gen_config["draft"], "token_embeddings": TOKEN_EMBEDDINGS}

        tmp = self.out / ".merge"
        shutil.rmtree(tmp, ignore_errors=True)
        ds.save_to_disk(str(tmp))
        for stale in self.out.glob("data-*.arrow"):
            stale.unlink()
        for f in tmp.iterdir():
            commit(f, self.out / f.name)  # fsync each before it takes its final name
        tmp.rmdir()

        counts = {
            "rows": len(ds),
            "positions": int(labels.size),
            "draft_positions": int(per_row.sum()),
            # fsum: exactly rounded, so the order the parts were labelled in (a resumed run's differs)
            # cannot change the last digits.
            "mean_label": math.fsum(labels.astype(np.float64).tolist()) / labels.size if labels.size else 0.0,
            "share_label_one": float((labels >= 1.0).mean()) if labels.size else 0.0,
        }
        gen_config = {
            "format": FORMAT,
            "version": VERSION,
            **gen_config,
            "counts": counts,
            "features": features,
            "lookahead_features": lookahead,
        }
        write_json(self.out / GEN_CONFIG, gen_config)
        mark_complete(self.out, KIND, self.settings)
        shutil.rmtree(self.shard_dir, ignore_errors=True)  # the dataset now holds everything
        return gen_config

    def _merge_features(self, path: Path, total: int, hidden_size: int, suffix: str = ".npy") -> None:
        """Stream the parts' features into one (total, H) float16 .npy, in the dataset's row order.

        `self._layout[suffix]` (set by `merge`) gives each row's feature count in part order and the row
        permutation to prompt order; one part is in memory at a time.
        """
        counts, order = self._layout[suffix]
        final = counts[order]
        dest_of_row = np.empty_like(counts)
        dest_of_row[order] = np.cumsum(final) - final  # where a part-order row's block goes in the output
        src = np.cumsum(counts) - counts  # where it is in the parts, concatenated
        out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(total, hidden_size))
        row = start = 0
        for k in self.parts():
            part = np.load(self.shard_path(k, suffix), mmap_mode="r")
            n_rows = sum(len(self.batches[b]) for b in range(*k))
            rows = slice(row, row + n_rows)
            within = np.arange(len(part)) - np.repeat(src[rows] - start, counts[rows])
            out[np.repeat(dest_of_row[rows], counts[rows]) + within] = part
            row, start = row + n_rows, start + len(part)
        if start != total:
            raise AccheadError(f"feature parts hold {start} rows, the dataset {total} positions")
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
