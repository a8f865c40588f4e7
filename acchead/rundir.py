"""Output directories that belong to one run: durable atomic writes, a lock, and the run's identity.

Every stage that writes an output directory (`acchead-gen-data`, `acchead-train`, `acchead-sweep`,
`acchead-bench`) goes through this module, so they behave alike:

- **Atomic and durable writes.** `atomic_write` writes a temporary sibling, fsyncs it, renames it over the
  final name and fsyncs the directory. A file is then either absent or complete, after a kill *and* after
  a power loss (a rename that reached the disk before the data did would otherwise leave a truncated file).
- **One process per directory.** `DirLock` holds an exclusive `flock` on `OUT/.acchead.lock` for the whole
  run; a second process gets one line naming the holder's pid. The kernel drops the lock when its holder
  dies, so a killed run never leaves a stale lock behind.
- **Same run = resume, another run = refusal.** `claim` compares the identity of the run about to start (a
  JSON object of everything its output depends on) with the one recorded in OUT's manifest. The same
  identity resumes (or reports the finished run); another one is refused with one line naming the keys
  that differ; `overwrite=True` empties the directory first, stale checkpoints and partial results
  included. A directory holding files that are no acchead output is never touched, not even with
  `overwrite`.

Manifests are `OUT/<kind>_run.json` (`gen_run.json`, `train_run.json`, `sweep_run.json`, `bench_run.json`):
`{"format": "acchead-run", "version", "kind", "identity_hash", "identity", "complete"}`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from acchead.errors import AccheadError

try:  # POSIX; elsewhere runs are not locked (documented in docs/reliability.md)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".acchead.lock"
MANIFEST_FORMAT, MANIFEST_VERSION = "acchead-run", 2
KINDS = ("gen-data", "train", "sweep", "bench")
# Files a stage wrote before run manifests existed: such a directory is recognisably acchead output (so
# `--overwrite` may replace it), but its identity is unknown (so it is never resumed).
LEGACY_NAMES = {
    "gen-data": {"gen_config.json", "features.npy", "shards", "dataset_info.json", "state.json"},
    "train": {"head.safetensors", "metrics.json", "train_config.yaml", "checkpoints", "logs"},
    "sweep": {"sweep.md", "sweep.json", "heads"},
    "bench": {"partial", "results.json", "pareto.png", "report.md"},
}
_TMP_TAG = ".tmp"


def manifest_name(kind: str) -> str:
    """`gen_run.json`, `train_run.json`, `sweep_run.json` or `bench_run.json`."""
    if kind not in KINDS:
        raise ValueError(f"unknown run kind {kind!r}")
    return f"{kind.split('-')[0]}_run.json"


# ------------------------------------------------------------------------------------ durable atomic writes


def fsync_file(path: str | Path) -> None:
    """Flush a written file's data to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    """Flush a directory's entries (renames, creations) to the disk; a no-op where that is impossible."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover  (e.g. Windows)
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover  (some filesystems refuse fsync on directories)
        pass
    finally:
        os.close(fd)


def tmp_sibling(path: str | Path) -> Path:
    """`dir/.name.tmpPID.suffix`: hidden, unique per process, and keeping the suffix (np.save, savefig)."""
    path = Path(path)
    return path.with_name(f".{path.stem}{_TMP_TAG}{os.getpid()}{path.suffix}")


def commit(tmp: str | Path, path: str | Path) -> None:
    """Make a fully written `tmp` the file `path`: fsync its data, rename it, fsync the directory."""
    fsync_file(tmp)
    os.replace(tmp, path)
    fsync_dir(Path(path).parent)


def atomic_write(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """Write `path` through `write(tmp)` so that it is either absent or complete, across kills and power loss.

    The temporary file is removed if `write` fails. Returns `path`.
    """
    path = Path(path)
    tmp = tmp_sibling(path)
    try:
        write(tmp)
        commit(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Atomic, durable UTF-8 text file."""
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | Path, obj: Any, **dumps: Any) -> Path:
    """Atomic, durable JSON (`json.dumps` keyword arguments pass through; default: indent 2, sorted keys)."""
    opts = {"indent": 2, "sort_keys": True, **dumps}
    return atomic_write_text(path, json.dumps(obj, **opts) + "\n")


def remove_stale_tmp(directory: str | Path) -> int:
    """Delete the temporary files `atomic_write` leaves when killed mid-write; returns how many.

    Call it only while holding the directory's lock: a live writer's temporary file would go too.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return 0
    n = 0
    for p in directory.iterdir():
        if _is_tmp(p):
            p.unlink(missing_ok=True)
            n += 1
    return n


def _is_tmp(p: Path) -> bool:
    """A temporary file of `atomic_write` (`tmp_sibling`)."""
    return p.name.startswith(".") and _TMP_TAG in p.name and p.is_file()


# ----------------------------------------------------------------------------------------------- the lock


class DirLock:
    """An exclusive lock on an output directory for the lifetime of one run (context manager).

    `acquire` creates the directory if needed and takes a non-blocking `flock` on `OUT/.acchead.lock`,
    then writes `pid prog` into it. A second process (or a second lock in this one) gets an AccheadError
    naming the holder's pid. The lock file itself stays: it is empty of meaning once unlocked.

    Args:
        out: the output directory.
        prog: the program name recorded for other processes to see (e.g. "acchead-train").
    """

    def __init__(self, out: str | Path, prog: str) -> None:
        self.out = Path(out)
        self.prog = prog
        self.path = self.out / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> DirLock:
        if self._fd is not None:
            return self
        if self.out.exists() and not self.out.is_dir():
            raise AccheadError(f"output path {self.out} exists and is not a directory")
        self.out.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 200).decode("utf-8", "replace").split()
                os.close(fd)
                who = f"{holder[1]} (pid {holder[0]})" if len(holder) >= 2 else "another process"
                raise AccheadError(
                    f"{self.out} is in use by {who}; wait for it to finish or use another --out"
                ) from None
            except OSError as e:  # a filesystem without flock (some network mounts): run unlocked
                print(f"{self.prog}: warning: cannot lock {self.out} ({e}); runs unlocked", file=sys.stderr)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {self.prog}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> DirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


# ----------------------------------------------------------------------------------------- run identity


def identity_hash(identity: dict[str, Any]) -> str:
    """sha256 (16 hex digits) of the canonical JSON of a run's identity."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def _read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest at `path` in the current format, or None if it is another (older) format."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        msg = f"{path} is unreadable ({e}); use another --out, or --overwrite to replace it"
        raise AccheadError(msg) from e
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        return None
    return data


def _entries(out: Path) -> list[Path]:
    return [p for p in out.iterdir() if p.name != LOCK_NAME] if out.is_dir() else []


def clear_dir(out: str | Path) -> None:
    """Delete everything in `out` except the lock file (the caller holds the lock)."""
    for p in _entries(Path(out)):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)
    fsync_dir(out)


def claim(out: str | Path, kind: str, identity: dict[str, Any], *, overwrite: bool = False) -> str:
    """Decide what a run of `kind` with `identity` may do in `out`; call it holding `DirLock(out)`.

    Returns:
        "new" (nothing of this run there yet: the caller starts it and calls `start`), "resume" (this run,
        unfinished), or "complete" (this run, finished). With `overwrite`, an acchead run directory of any
        kind and identity is emptied first and "new" returned.

    Raises:
        AccheadError: OUT holds another run (naming the keys that differ, or the other kind), output of an
            older acchead without a manifest, an unreadable manifest, or files that are no acchead output.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise AccheadError(f"output path {out} exists and is not a directory")
    entries = _entries(out)
    if not entries:
        return "new"
    hint = "use another --out, or --overwrite to replace it"
    mine = out / manifest_name(kind)
    others = [k for k in KINDS if k != kind and (out / manifest_name(k)).is_file()]
    if mine.is_file():
        manifest = _read_manifest(mine)
        if overwrite:
            clear_dir(out)
            return "new"
        if manifest is None:
            raise AccheadError(f"{out} holds a {kind} run written by an older acchead; {hint}")
        if manifest.get("kind") != kind:
            raise AccheadError(f"{out} holds a {manifest.get('kind')} run, not a {kind} run; {hint}")
        if manifest.get("identity_hash") != identity_hash(identity):
            diff = _differences(manifest.get("identity", {}), identity) or ["format"]
            raise AccheadError(f"{out} holds a different {kind} run (differs in: {', '.join(diff)}); {hint}")
        return "complete" if manifest.get("complete") else "resume"
    if others:
        if overwrite:
            clear_dir(out)
            return "new"
        raise AccheadError(f"{out} holds a {others[0]} run, not a {kind} run; {hint}")
    if _legacy(entries):
        if overwrite:
            clear_dir(out)
            return "new"
        raise AccheadError(f"{out} holds acchead output without a run manifest (an older acchead); {hint}")
    _refuse_foreign(out, kind, overwrite)
    return "new"  # unreachable: _refuse_foreign raises


def _legacy(entries: list[Path]) -> bool:
    names = {p.name for p in entries}
    legacy = {n for k in KINDS for n in LEGACY_NAMES[k]}
    return names <= legacy | {n for n in names if n.startswith("data-") or n == ".merge"}


def _refuse_foreign(out: Path, kind: str, overwrite: bool) -> None:
    extra = " (--overwrite replaces only acchead output)" if overwrite else ""
    raise AccheadError(f"{out} is not empty and holds no {kind} run; refusing to write into it{extra}")


def refuse_foreign(out: str | Path, kind: str, *, overwrite: bool = False) -> None:
    """Before taking the lock: refuse, without touching it, a non-empty OUT that holds no acchead output.

    (The lock file would otherwise be left in, say, a home directory given as --out by mistake.)
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise AccheadError(f"output path {out} exists and is not a directory")
    # A run's temporary files do not make OUT foreign: a live run that has taken the lock may not have
    # committed its manifest yet (it is refused as "in use" by the lock instead).
    entries = [p for p in _entries(out) if not _is_tmp(p)]
    if not entries or any((out / manifest_name(k)).is_file() for k in KINDS) or _legacy(entries):
        return
    _refuse_foreign(out, kind, overwrite)


def refuse_out_holding(out: str | Path, **inputs: str | Path | None) -> None:
    """One line when OUT is one of the run's inputs or a folder above one (`--out` given the `--data`
    directory, say): claiming OUT, or replacing it under `--overwrite`, would delete that input. `inputs`:
    each input's flag name (underscores for dashes) -> its path (None: not given)."""
    where = Path(out).expanduser().resolve()
    for name, path in inputs.items():
        if path is None:
            continue
        held = Path(path).expanduser().resolve()
        if held == where or where in held.parents:
            flag = "--" + name.replace("_", "-")
            raise AccheadError(f"--out {out} holds the input {flag} {path}: give another --out")


def start(out: str | Path, kind: str, identity: dict[str, Any]) -> None:
    """Record a new run's identity in OUT's manifest (before any other output is written)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _write_manifest(out, kind, identity, complete=False)


def mark_complete(out: str | Path, kind: str, identity: dict[str, Any]) -> None:
    """Record that the run finished: every output it promises is on disk (written and fsynced before)."""
    _write_manifest(Path(out), kind, identity, complete=True)


def _write_manifest(out: Path, kind: str, identity: dict[str, Any], complete: bool) -> None:
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "kind": kind,
        "identity_hash": identity_hash(identity),
        "identity": identity,
        "complete": complete,
    }
    atomic_write_json(out / manifest_name(kind), manifest, default=str)


@contextlib.contextmanager
def locked_run(
    out: str | Path, kind: str, identity: dict[str, Any], *, prog: str, overwrite: bool = False
):
    """Lock OUT, claim it for this run and record a new run's manifest; yields the `claim` status.

    The lock is held until the block exits. Stale temporary files of a killed earlier attempt are removed.
    """
    refuse_foreign(out, kind, overwrite=overwrite)
    lock = DirLock(out, prog).acquire()
    try:
        status = claim(out, kind, identity, overwrite=overwrite)
        remove_stale_tmp(out)
        if status == "new":
            start(out, kind, identity)
        yield status
    finally:
        lock.release()


def is_main_launch_process() -> bool:
    """False in the worker processes a launcher (torchrun, Lightning DDP, accelerate) starts beside rank 0.

    Decided from the environment before any process group exists: only the process with global rank 0
    (or a plain single-process run) locks and claims the output directory.
    """
    for var in ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK"):
        value = os.environ.get(var)
        if value not in (None, "", "0"):
            return False
    return True
