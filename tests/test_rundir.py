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
