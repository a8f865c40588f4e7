"""Teacher-forced labels for the draft: the argmax at reply positions equals one-exchange-at-a-time
decoding's, shards round-trip and resume, packing labels reply positions only, and the command end to end
on a ShareGPT file of our own (held-out openings never enter)."""

from __future__ import annotations

import json

import pytest
import torch

from acchead import assets, chat_sets
from acchead.distill import cli
from acchead.distill.draft import IGNORE, OUTSIDE
from acchead.distill.responses import PlanItem, ResponsesConfig, run_responses
from acchead.distill.teacher import (
    TeacherConfig,
    TeacherShard,
    exchange_ids,
    label_batch,
    load_teacher,
    pack_teacher,
    run_teacher,
)
from acchead.errors import AccheadError
from acchead.models import load_causal_lm

TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"  # fmt: skip # noqa: E501


def _exchanges(tok, n: int = 5) -> list[tuple[list[int], int]]:
    out = []
    for i in range(n):
        prompt = tok(f"def f{i}(x):" + " y" * i).input_ids
        out.append((exchange_ids(tok, prompt, "    return x" + " + 1" * (i % 3), max_len=40), len(prompt)))
    return out


def test_labels_are_the_argmax_after_each_reply_prefix(tiny_llama_pair, tiny_tokenizer):
    target, _ = tiny_llama_pair
    exchanges = _exchanges(tiny_tokenizer)
    assert len({len(ids) for ids, _ in exchanges}) > 1  # ragged: the batch is right-padded
    batched = label_batch(target, exchanges, pad_id=tiny_tokenizer.eos_token_id)
    for (ids, p), labels in zip(exchanges, batched, strict=True):
        assert ids[-1] == tiny_tokenizer.eos_token_id and len(labels) == len(ids) - p + 1
        alone = target(torch.tensor([ids])).logits[0].argmax(-1)  # (T,) argmax after each prefix
        assert labels == alone[p - 1 :].tolist()


def test_shards_round_trip_resume_and_refuse_other_settings(tiny_llama_pair, tiny_tokenizer, tmp_path):
    target, _ = tiny_llama_pair
    exchanges = _exchanges(tiny_tokenizer)
    config = TeacherConfig(target="t", num_exchanges=5, max_len=40, shard_exchanges=2)
    summary = run_teacher(target, tiny_tokenizer, exchanges, tmp_path, config, batch_size=2)
    assert summary["shards_written"] == 3 and summary["labels"] == sum(len(i) - p + 1 for i, p in exchanges)
    shards = load_teacher(tmp_path)
    assert [ids for s in shards for ids in s.ids] == [ids for ids, _ in exchanges]
    first = shards[0].labels
    (tmp_path / "teacher-00001.npz").unlink()  # a run killed while shard 1 was in flight
    again = run_teacher(target, tiny_tokenizer, exchanges, tmp_path, config, batch_size=3)
    assert again["shards_written"] == 1 and load_teacher(tmp_path)[0].labels == first
    assert [s.labels for s in load_teacher(tmp_path)] == [s.labels for s in shards]
    other = TeacherConfig(target="t", num_exchanges=5, max_len=30, shard_exchanges=2)
    with pytest.raises(AccheadError, match=r"other settings \(max_len\)"):
        run_teacher(target, tiny_tokenizer, exchanges, tmp_path, other, batch_size=2)


def test_packing_labels_reply_positions_only():
    shard = TeacherShard(ids=[[5, 6, 7, 8, 9]], prompt_len=[2], labels=[[20, 21, 22, 23]])
    to_draft = torch.full((32,), OUTSIDE)
    to_draft[20], to_draft[22], to_draft[23] = 0, 1, 2  # 21 is outside the draft's head
    ((x, y),) = pack_teacher([shard], to_draft, max_len=512)
    assert x.tolist() == [5, 6, 7, 8, 9] and y.tolist() == [IGNORE, 0, OUTSIDE, 1, 2]
    ((x, y),) = pack_teacher([shard], to_draft, max_len=3)
    assert x.tolist() == [5, 6, 7] and y.tolist() == [IGNORE, 0, OUTSIDE]


def test_teacher_command_end_to_end(tiny_pair_dirs, tiny_tokenizer, tmp_path, monkeypatch, capsys):
    """On a ShareGPT file of four openings (one held out): three exchanges labelled through the chat
    template, then trained on beside the responses by `train --teacher`."""
    target_dir, _ = tiny_pair_dirs
    chatty = tmp_path / "target"
    chatty.mkdir()
    for f in target_dir.iterdir():
        (chatty / f.name).write_bytes(f.read_bytes())
    tok = type(tiny_tokenizer).from_pretrained(target_dir)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(chatty)
    monkeypatch.setenv("ACCHEAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(chat_sets, "SHAREGPT_HELDOUT", 1)
    records = [{"id": f"{k}_0", "conversations": [{"from": "human", "value": f"write f{k}"},
                                                  {"from": "gpt", "value": f"def f{k}(): pass"}]}
               for k in range(4)]  # fmt: skip
    path = tmp_path / "cache" / "assets" / "sharegpt" / assets.ASSETS["sharegpt"].filename
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(records))
    argv = ["teacher", "--target", str(chatty), "--out", str(tmp_path / "teach"), "--shard-exchanges", "2"]
    assert cli.main(argv) == 0
    shards = load_teacher(tmp_path / "teach")
    texts = [tok.decode(ids) for s in shards for ids in s.ids]
    assert len(texts) == 3 and texts[0].startswith("<|user|>write f0<|assistant|>def f0")
    assert not any("f3" in t for t in texts)  # the held-out opening
    assert "num_exchanges=3" in capsys.readouterr().out
    plan = [PlanItem(p, False, "code") for p in ["def add(a, b):", "import os", "x = 1"]]
    config = ResponsesConfig(target="t", prompts="train", num_prompts=3, code_every=0, max_new_tokens=8,
                             max_prompt_tokens=64, shard_prompts=1, heldout_chat=0)  # fmt: skip
    run_responses(load_causal_lm(chatty), tok, plan, tmp_path / "resp", config, batch_size=2)
    train = ["train", "--target", str(chatty), "--responses", str(tmp_path / "resp"), "--out",
             str(tmp_path / "run"), "--vocab-size", "16", "--layers", "1", "--minutes", "0.02",
             "--held-out-shards", "1", "--total-tokens", "50", "--vocab-background", "0"]  # fmt: skip
    assert cli.main([*train, "--teacher", str(tmp_path / "teach")]) == 0
    assert "train_examples=5" in capsys.readouterr().out  # 2 responses + 3 exchanges
    assert cli.main([*train, "--teacher", str(tmp_path / "nothing")]) == 2
    assert "no teacher shards there" in capsys.readouterr().err
    bad = ["teacher", "--target", str(chatty), "--out", str(tmp_path / "t2"), "--max-len", "0"]
    assert cli.main(bad) == 2
    assert "--max-len must be >= 1" in capsys.readouterr().err
