"""The bench's prompts: JSON-lines files (a line may be a chat turn), named sets, and their encoding."""

from __future__ import annotations

import copy

import pytest

from acchead.errors import AccheadError
from acchead.prompt_sources import encode_prompts, load_prompts, read_jsonl_prompts
from acchead.prompting import is_chat


def test_a_line_can_be_a_chat_turn_and_is_encoded_through_the_template(
    tmp_path, tiny_llama_pair, tiny_tokenizer
):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hi there", "chat": true}\n{"prompt": "def f():"}\n')
    prompts = load_prompts(str(path))
    assert prompts == ["hi there", "def f():"] and [is_chat(p) for p in prompts] == [True, False]
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}<|assistant|>"
    target, draft = tiny_llama_pair
    ids, _ = encode_prompts(prompts, tok, target, draft, max_new_tokens=8, device="cpu")
    assert tok.decode(ids[0][0]) == "<|user|>hi there<|assistant|>"
    assert ids[1][0].tolist() == tok("def f():", add_special_tokens=False).input_ids
    path.write_text('{"prompt": "hi", "chat": 1}\n')
    with pytest.raises(AccheadError, match=r'p\.jsonl:1: "chat" must be true or false'):
        read_jsonl_prompts(path)


def test_chat_sets_need_their_assets():
    with pytest.raises(AccheadError, match="run `acchead-assets`"):
        load_prompts("mtbench")
