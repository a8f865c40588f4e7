"""The real pair's assets: installed from wheels into the cache, found by name, missing ones named with the
command that installs them; the ShareGPT and MT-bench readers on small files of the same shape."""

from __future__ import annotations

import json
import zipfile

import pytest

from acchead import assets, chat_sets
from acchead.errors import AccheadError


@pytest.fixture
def fake_asset(tmp_path, monkeypatch):
    """A wheel holding `fake_pkg/data/notes.txt`, registered as asset "fake"; the wheels directory."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "fake_pkg-1.0-py3-none-any.whl", "w") as z:
        z.writestr("fake_pkg/data/notes.txt", "hello\n" * 1000)
        z.writestr("fake_pkg/__init__.py", "")
    monkeypatch.setitem(assets.ASSETS, "fake", assets.Asset("fake-pkg", "1.0", "fake_pkg/data/notes.txt"))
    monkeypatch.setenv("ACCHEAD_CACHE_DIR", str(tmp_path / "cache"))
    return wheels


def test_install_extracts_records_and_skips_when_done(fake_asset):
    with pytest.raises(AccheadError, match=r"asset fake is not installed .*run `acchead-assets`"):
        assets.asset_path("fake")
    path = assets.install_asset("fake", wheel_dir=fake_asset)
    assert path == assets.asset_path("fake") and path.read_text() == "hello\n" * 1000
    record = json.loads((path.parent / "asset.json").read_text())
    assert record["version"] == "1.0" and record["bytes"] == 6000 and len(record["sha256"]) == 64
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temporary file left
    mtime = path.stat().st_mtime_ns
    (fake_asset / "fake_pkg-1.0-py3-none-any.whl").unlink()  # a second install needs no wheel
    assert assets.install_asset("fake", wheel_dir=fake_asset).stat().st_mtime_ns == mtime


def test_wheel_without_the_member_is_one_line(fake_asset, monkeypatch):
    monkeypatch.setitem(assets.ASSETS, "fake", assets.Asset("fake-pkg", "1.0", "fake_pkg/data/other.txt"))
    with pytest.raises(AccheadError, match=r"holds no fake_pkg/data/other\.txt"):
        assets.install_asset("fake", wheel_dir=fake_asset)


def test_unknown_asset_and_list(fake_asset, capsys):
    with pytest.raises(AccheadError, match="unknown asset 'nope'; known: smollm2"):
        assets.asset_path("nope")
    assert assets.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "smollm2: missing" in out and "smollm2-target: missing" in out


def _sharegpt_file(tmp_path):
    """Four records, the last cut off mid-record as in the packaged file."""
    records = [
        {
            "id": "a_0",
            "conversations": [{"from": "human", "value": " Hi there "}, {"from": "gpt", "value": "x"}],
        },
        {"id": "a_1", "conversations": [{"from": "human", "value": "continue please"}]},
        {
            "id": "b_0",
            "conversations": [{"from": "gpt", "value": "I open"}, {"from": "human", "value": "ok"}],
        },
        {"id": "c_0", "conversations": [{"from": "human", "value": "Hi there"}]},
        {"id": "d_0", "conversations": [{"from": "human", "value": "y" * 50}]},
        {"id": "e_0", "conversations": [{"from": "human", "value": "Write a poem."}]},
    ]
    text = "[\n" + ",\n".join("  " + json.dumps(r) for r in records) + ',\n  {"id": "f_0", "conversa'
    path = tmp_path / "sharegpt.json"
    path.write_text(text)
    return path


def test_sharegpt_reads_a_truncated_file_record_by_record(tmp_path):
    path = _sharegpt_file(tmp_path)
    with pytest.raises(json.JSONDecodeError):
        json.loads(path.read_text())
    assert [r["id"] for r in chat_sets.iter_sharegpt(path)] == ["a_0", "a_1", "b_0", "c_0", "d_0", "e_0"]
    # openings of first records only, stripped, deduplicated, long ones dropped
    assert chat_sets.sharegpt_prompts(path=path, max_chars=40) == ["Hi there", "Write a poem."]
    assert chat_sets.sharegpt_prompts(path=path, limit=1) == ["Hi there"]


def test_mtbench_first_turns(tmp_path):
    path = tmp_path / "question.jsonl"
    rows = [
        {"question_id": 81 + i, "category": "writing", "turns": [f"q{i}", f"follow-up {i}"]} for i in range(3)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert chat_sets.mtbench_prompts(path=path) == ["q0", "q1", "q2"]
    assert chat_sets.mtbench_prompts(limit=2, path=path) == ["q0", "q1"]
    path.write_text("not json\n")
    with pytest.raises(AccheadError, match=r"question.jsonl:1: not a JSON object"):
        chat_sets.mtbench_prompts(path=path)


def test_chat_prompt_sets(tmp_path, monkeypatch):
    """The named chat sets read the installed files: MT-bench's first turns, ShareGPT's openings split into
    training and held-out parts; every prompt is a ChatPrompt."""
    from acchead.prompting import is_chat

    monkeypatch.setenv("ACCHEAD_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(AccheadError, match="run `acchead-assets`"):
        chat_sets.chat_prompt_set("mtbench")
    src = _sharegpt_file(tmp_path)
    (tmp_path / "cache" / "assets" / "sharegpt").mkdir(parents=True)
    (tmp_path / "cache" / "assets" / "sharegpt" / assets.ASSETS["sharegpt"].filename).write_text(
        src.read_text()
    )
    monkeypatch.setattr(chat_sets, "SHAREGPT_HELDOUT", 1)
    assert chat_sets.chat_prompt_set("sharegpt") == ["Hi there", "y" * 50]
    assert chat_sets.chat_prompt_set("sharegpt-heldout") == ["Write a poem."]
    assert all(is_chat(p) for p in chat_sets.chat_prompt_set("sharegpt", limit=1))
    with pytest.raises(AccheadError, match="unknown chat prompt set 'nope'"):
        chat_sets.chat_prompt_set("nope")


@pytest.mark.slow
def test_installed_real_assets_match_their_counts(real_assets):
    """On a machine where `acchead-assets` ran: the counts the docs quote, and the converted target equals
    the GGUF file's dequantised model."""
    import torch

    from acchead.models import load_causal_lm

    assert (
        sum(1 for _ in chat_sets.iter_sharegpt(real_assets["sharegpt"])) == chat_sets.SHAREGPT_CONVERSATIONS
    )
    assert len(chat_sets.mtbench_prompts(path=real_assets["mtbench"])) == 80
    ids = torch.tensor([[1, 504, 3458, 28, 2]])
    with torch.no_grad():
        a = load_causal_lm(real_assets[assets.TARGET_DIR_NAME])(ids).logits
        b = load_causal_lm(real_assets["smollm2"])(ids).logits
    assert torch.equal(a, b)


def test_sharegpt_later_turns_skip_openings_short_ones_and_held_out_conversations(tmp_path, monkeypatch):
    ask = "Now write the same function in Rust, please, with tests."
    records = [
        {"id": "a_0", "conversations": [
            {"from": "human", "value": "Explain recursion to a child, in a few lines."},
            {"from": "gpt", "value": "..."},
            {"from": "human", "value": "continue"},  # a follow-up that needs its context: too short
            {"from": "human", "value": f" {ask} "},
        ]},
        {"id": "a_1", "conversations": [  # a continuation record: its first turn counts
            {"from": "human", "value": "And what would a base case look like in that example?"},
            {"from": "gpt", "value": "Explain recursion to a child, in a few lines. (a gpt turn)"},
        ]},
        {"id": "b_0", "conversations": [
            {"from": "human", "value": "Explain recursion to a child, in a few lines."},  # an opening again
            {"from": "human", "value": ask},  # a duplicate
        ]},
        {"id": "h_0", "conversations": [  # the held-out opening: none of its turns
            {"from": "human", "value": "Held-out opening"},
            {"from": "human", "value": "A later turn of a held-out conversation, long enough."},
        ]},
        {"id": "h_1", "conversations": [
            {"from": "human", "value": "Its continuation record is held out too."},
        ]},
    ]  # fmt: skip
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(records))
    monkeypatch.setattr(chat_sets, "SHAREGPT_HELDOUT", 1)
    assert chat_sets.sharegpt_prompts(path=path) == [
        "Explain recursion to a child, in a few lines.", "Held-out opening"
    ]
    assert chat_sets.sharegpt_later_turns(path=path) == [
        ask, "And what would a base case look like in that example?"
    ]


def test_install_all_converts_the_target_once_and_says_so(fake_asset, monkeypatch):
    """A second `acchead-assets` (each `make demo` runs it) skips the conversion and says it did."""
    monkeypatch.setattr(assets, "ASSETS", {"smollm2": assets.ASSETS["fake"]})
    calls = []

    def fake_convert(gguf):
        calls.append(gguf)
        out = assets.assets_dir() / assets.TARGET_DIR_NAME
        out.mkdir(parents=True)
        for name in ("config.json", "model.safetensors"):
            (out / name).write_text("{}")
        return out

    monkeypatch.setattr(assets, "convert_target", fake_convert)
    logs: list[str] = []
    for _ in range(2):
        assets.install_all(fake_asset, log=logs.append)
    assert len(calls) == 1 and assets.target_converted()
    assert "converting notes.txt" in logs[1] and logs[3] == f"{assets.TARGET_DIR_NAME}: already converted"
