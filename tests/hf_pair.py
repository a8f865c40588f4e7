"""Fixtures of the `generate` integration's tests (tests/test_hf_generate.py, test_hf_directory_form.py): a
peaked tiny pair over the tiny tokenizer, a head for its draft, a prompt, and a streamer that records."""

from __future__ import annotations

import pytest
from exact_models import _peaked_llama, _perturbed

from acchead.head import AcceptanceHead

PROMPT = "def f(x):"


@pytest.fixture(scope="module")
def pair(tiny_tokenizer):
    """(target, draft) over the tiny tokenizer's 320 ids: peaked, varied greedy output (the conftest pair's
    repeats one token), and a close draft, so rounds accept several candidates."""
    target = _peaked_llama(len(tiny_tokenizer), seed=3, init=0.3)
    return target, _perturbed(target, 0.02, seed=5)


@pytest.fixture(scope="module")
def head(pair):
    return AcceptanceHead(pair[1].config.hidden_size, depth=1)


@pytest.fixture
def prompt(tiny_tokenizer):
    return tiny_tokenizer(PROMPT, return_tensors="pt")


class Record:
    """A streamer that records every `put` (as a flat list) and counts `end`s."""

    def __init__(self):
        self.puts, self.ends = [], 0

    def put(self, value):
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ends += 1
