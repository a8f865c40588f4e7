"""Prompt sources of acchead-gen-data: four file formats, datasets from disk, chat templates, context fit."""

from __future__ import annotations

import copy
import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from acchead.data_gen.prompts import (
    PromptSource,
    encode_prompts,
    fit_to_context,
    load_prompts,
    prompts_digest,
)
from acchead.errors import AccheadError
from acchead.prompting import is_chat

PROMPTS = ["def f(x):\n    return x", "class A:\n    pass", "import os"]


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".txt"])
def test_file_formats_read_the_same_prompts(tmp_path, suffix):
    path = tmp_path / f"p{suffix}"
    rows = [{"text": p, "id": i} for i, p in enumerate(PROMPTS)]
    if suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:  # one prompt per line: single-line prompts only
        path.write_text("\n\n".join(p.replace("\n", " ") for p in PROMPTS) + "\n")
    got = load_prompts(PromptSource("file", str(path), field="text"))
    assert got == (PROMPTS if suffix != ".txt" else [p.replace("\n", " ") for p in PROMPTS])
    assert load_prompts(PromptSource("file", str(path), field="text"), limit=2) == got[:2]
    if suffix != ".txt":
        with pytest.raises(AccheadError, match="no prompt field 'prompt'"):
            load_prompts(PromptSource("file", str(path)))


def test_json_list_of_strings(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(PROMPTS))
    assert load_prompts(PromptSource("file", str(path))) == PROMPTS
    path.write_text(json.dumps({"prompts": PROMPTS}))
    with pytest.raises(AccheadError, match="expected a JSON list"):
        load_prompts(PromptSource("file", str(path)))


def test_dataset_saved_to_disk(tmp_path):
    dd = datasets.DatasetDict({"test": datasets.Dataset.from_dict({"question": PROMPTS})})
    dd.save_to_disk(str(tmp_path / "dd"))
    assert (
        load_prompts(PromptSource("dataset", str(tmp_path / "dd"), field="question", split="test")) == PROMPTS
    )
    with pytest.raises(AccheadError, match="no split 'train'"):
        load_prompts(PromptSource("dataset", str(tmp_path / "dd"), field="question"))
    with pytest.raises(AccheadError, match="no prompt field 'prompt'"):
        load_prompts(PromptSource("dataset", str(tmp_path / "dd"), split="test"))


def test_dataset_name_not_in_cache_is_not_downloaded(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    with pytest.raises(AccheadError, match="from disk or the local cache"):
        load_prompts(PromptSource("dataset", "acchead-nonexistent/never-downloaded"))
    assert datasets.config.HF_HUB_OFFLINE is False  # offline only for the duration of the load


def test_builtin_set_by_name():
    prompts = load_prompts(PromptSource("builtin", "humaneval"), limit=3)
    assert len(prompts) == 3 and all("def " in p for p in prompts)
    with pytest.raises(AccheadError, match="unknown prompt set"):
        load_prompts(PromptSource("builtin", "no-such-set"))


def test_chat_template_wraps_prompts(tiny_tokenizer):
    with pytest.raises(AccheadError, match="no chat template"):
        encode_prompts(PROMPTS, tiny_tokenizer, chat_template=True)
    tpl = copy.deepcopy(tiny_tokenizer)  # the session fixture stays template-free
    tpl.chat_template = "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}<|assistant|>"
    ids = encode_prompts(PROMPTS[:1], tpl, chat_template=True)[0]
    assert tpl.decode(ids) == f"<|user|>{PROMPTS[0]}<|assistant|>"
    assert encode_prompts(PROMPTS[:1], tpl)[0] == tpl(PROMPTS[0]).input_ids


def test_a_file_line_can_be_a_chat_turn(tiny_tokenizer, tmp_path):
    """`{"prompt": ..., "chat": true}` goes through the chat template; the other lines stay raw."""
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hi there", "chat": true}\n{"prompt": "def f():"}\n"x = 1"\n')
    prompts = load_prompts(PromptSource("file", str(path)))
    assert prompts == ["hi there", "def f():", "x = 1"] and [is_chat(p) for p in prompts] == [
        True,
        False,
        False,
    ]
    tpl = copy.deepcopy(tiny_tokenizer)
    tpl.chat_template = "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}<|assistant|>"
    ids = encode_prompts(prompts, tpl)
    assert tpl.decode(ids[0]) == "<|user|>hi there<|assistant|>" and ids[1] == tpl("def f():").input_ids
    path.write_text('{"prompt": "hi", "chat": "yes"}\n')
    with pytest.raises(AccheadError, match='line 1: "chat" must be true or false'):
        load_prompts(PromptSource("file", str(path)))


def test_fit_to_context_and_digest():
    ids = [[1, 2, 3], [1] * 10, [4]]
    assert fit_to_context(ids, max_new_tokens=5, context=10) == [0, 2]
    assert fit_to_context(ids, max_new_tokens=0, context=10) == [0, 1, 2]
    with pytest.raises(AccheadError, match="no tokens"):
        fit_to_context([[1], []], 5, 10)
    assert prompts_digest(ids) == prompts_digest([list(x) for x in ids])
    assert prompts_digest(ids) != prompts_digest([[1, 2], [3], *ids[1:]])  # boundaries count
