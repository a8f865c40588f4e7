"""The run-directory helpers every command's --out relies on (`acchead.rundir`): `claim` decides new /
resume / complete / refused, and an atomic write leaves the old file when its writer dies."""

from __future__ import annotations

from pathlib import Path

import pytest

from acchead.errors import AccheadError
from acchead.rundir import atomic_write_text, claim, start


def test_claim_decides_new_resume_complete_and_refusals(tmp_path):
    out = tmp_path / "o"
    assert claim(out, "bench", {"a": 1}) == "new"
    start(out, "bench", {"a": 1})
    assert claim(out, "bench", {"a": 1}) == "resume"
    with pytest.raises(AccheadError, match="differs in: a, b"):
        claim(out, "bench", {"a": 2, "b": 0})
    with pytest.raises(AccheadError, match="holds a bench run, not a train run"):
        claim(out, "train", {"a": 1})
    (out / "results.json").write_text("{}")
    assert claim(out, "train", {"a": 1}, overwrite=True) == "new" and not any(out.iterdir())
    legacy = tmp_path / "legacy"
    (legacy / "checkpoints").mkdir(parents=True)
    with pytest.raises(AccheadError, match="without a run manifest"):
        claim(legacy, "train", {})


def test_atomic_write_leaves_the_old_file_when_the_writer_dies(tmp_path):
    path = tmp_path / "results.json"
    atomic_write_text(path, "old")

    def die(p: Path) -> None:
        p.write_text("half")
        raise RuntimeError("killed")

    from acchead.rundir import atomic_write

    with pytest.raises(RuntimeError):
        atomic_write(path, die)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_claim_refuses_files_a_manifest_cannot_vouch_for(tmp_path):
    """A file at OUT, an unreadable or older manifest, another kind's manifest, foreign files: each refused in
    one line; `--overwrite` empties an acchead run directory but never a foreign one."""
    from acchead.rundir import manifest_name, refuse_foreign

    a_file = tmp_path / "f"
    a_file.write_text("x")
    for refuse in (lambda: claim(a_file, "bench", {}), lambda: refuse_foreign(a_file, "bench")):
        with pytest.raises(AccheadError, match="exists and is not a directory"):
            refuse()
    out = tmp_path / "o"
    out.mkdir()
    (out / manifest_name("train")).write_text("{torn")
    with pytest.raises(AccheadError, match=r"train_run.json is unreadable .*--overwrite to replace it"):
        claim(out, "train", {})
    (out / manifest_name("train")).write_text('{"format": "acchead-run-0"}')
    with pytest.raises(AccheadError, match="holds a train run written by an older acchead"):
        claim(out, "train", {})
    (out / manifest_name("train")).write_text('{"format": "acchead-run", "kind": "bench"}')
    with pytest.raises(AccheadError, match="holds a bench run, not a train run"):
        claim(out, "train", {})
    assert claim(out, "train", {}, overwrite=True) == "new" and not any(out.iterdir())
    start(out, "sweep", {})
    assert claim(out, "train", {}, overwrite=True) == "new" and not any(out.iterdir())  # another kind's run
    (out / "checkpoints").mkdir()  # an older acchead's train output, without a manifest
    assert claim(out, "train", {}, overwrite=True) == "new" and not any(out.iterdir())
    (out / "notes.txt").write_text("mine")
    for overwrite, extra in ((False, ""), (True, r" \(--overwrite replaces only acchead output\)")):
        with pytest.raises(AccheadError, match=f"is not empty and holds no train run; refusing .*{extra}"):
            claim(out, "train", {}, overwrite=overwrite)
        with pytest.raises(AccheadError, match="holds no train run"):
            refuse_foreign(out, "train", overwrite=overwrite)
    assert (out / "notes.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="unknown run kind 'eval'"):
        manifest_name("eval")


def test_the_lock_names_its_holder_and_is_reentrant(tmp_path):
    from acchead.rundir import DirLock

    out = tmp_path / "o"
    with DirLock(out, "acchead-bench") as lock:
        assert lock.held and lock.acquire() is lock  # taking it again in the holder is a no-op
        with pytest.raises(AccheadError, match=r"in use by acchead-bench \(pid \d+\); wait for it"):
            DirLock(out, "acchead-train").acquire()
    assert not lock.held
    with DirLock(out, "acchead-train"):  # released: free again
        pass
    (tmp_path / "file").write_text("")
    with pytest.raises(AccheadError, match="exists and is not a directory"):
        DirLock(tmp_path / "file", "acchead-train").acquire()
