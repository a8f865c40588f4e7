"""A bench run's per-prompt partial results (`acchead.inference.bench.partials`): saved after every run,
read back only under the same fingerprint."""

from __future__ import annotations

import json

from acchead.inference.bench.partials import PromptRun, load_partial, partial_path, save_partial


def test_partials_round_trip_under_their_fingerprint(tmp_path):
    runs = {"specdec_k=4-token": PromptRun(3, 64, 16, 64, 16, 0.5, "abc"),
            "autoregressive-token": PromptRun(3, 64, 64, 0, 0, 1.0, "abd")}  # fmt: skip
    path = partial_path(tmp_path, 3)
    assert path == tmp_path / "partial" / "prompt-0003.json"
    save_partial(path, "f1", runs)
    assert load_partial(path, "f1") == runs
    assert load_partial(path, "f2") == {}  # another run's partials are recomputed
    assert runs["specdec_k=4-token"].counts().draft_calls == 64
    assert json.loads(path.read_text())["fingerprint"] == "f1"
    assert not list(path.parent.glob("*.tmp*"))  # written through a temporary file, renamed
    path.write_text("{not json")
    assert load_partial(path, "f1") == {}  # a torn file (from before atomic writes) is recomputed
    assert load_partial(tmp_path / "missing.json", "f1") == {}
