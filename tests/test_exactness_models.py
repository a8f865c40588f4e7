"""Exactness on tiny transformers: decoded sequences follow the target's exact distribution (chi-square),
and greedy decoding is token-for-token `transformers.generate(do_sample=False)`, for every policy and
verifier, on the eager and the fast path (the enumeration on a toy vocabulary: `test_exactness.py`)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from exact_models import _chi_square_p_value, _draws, _exact_sequences, _peaked_llama, _perturbed

from acchead.head import AcceptanceHead
from acchead.inference import SpeculativeDecoder
from acchead.inference.adaedl import AdaEDL
from acchead.sampling import SamplingConfig


@pytest.fixture(scope="module")
def peaked_pair():
    target = _peaked_llama(12, seed=3)
    return target, _perturbed(target, 0.5, seed=4)


CHI_CASES = [
    ("specdec:k=2", "token", SamplingConfig(1.0)),
    ("specdecpp:h=0.5,max=3", "block", SamplingConfig(1.0)),
    ("confidence:tau=0.5,max=3", "block", SamplingConfig(0.8, top_k=5, top_p=0.9)),
    ("specdec:k=3", "token", SamplingConfig(1.3, top_k=0, top_p=0.8)),
    # The draft's entropies here have median ~1.5 nats. AdaEDL with exaggerated adaptation (λ ±0.3 per
    # round: stop iff H > 1.8, then > 0.45 or never) so that its state changes the second round's stops.
    (AdaEDL(lam=0.4, max_draft=3, eps=0.3, beta2=0.0), "token", SamplingConfig(1.0)),
    ("entropy:tau=1.5,max=3", "block", SamplingConfig(0.9, top_k=6)),
]
CHI_DEFAULT = [*CHI_CASES[1:3], *CHI_CASES[4:]]


def _chi_square_case(pair, spec, verifier, cfg, n, length=3, fast=False):
    target, draft = pair
    head = AcceptanceHead(draft.config.hidden_size, depth=1)
    # fast: static KV caches, rolled back by position (compiled forwards are checked against eager ones
    # token for token in tests/test_fast_path.py; compiling here would cost minutes).
    dec = SpeculativeDecoder(target, draft, policy=spec, head=head, verifier=verifier, fast=fast,
                             compile=False)  # fmt: skip
    prompt = [1, 4]
    counts = Counter(
        tuple(dec.generate(torch.tensor(prompt), max_new_tokens=length, temperature=cfg.temperature,
                           top_k=cfg.top_k, top_p=cfg.top_p, seed=s).new_ids.tolist())
        for s in range(n)
    )
    return _chi_square_p_value(counts, _exact_sequences(target, prompt, length, cfg), n)


@pytest.mark.parametrize("fast", [False, True], ids=["eager", "fast"])
@pytest.mark.parametrize(("spec", "verifier", "cfg"), CHI_DEFAULT, ids=lambda x: str(x))
def test_chi_square_tiny_transformers(peaked_pair, spec, verifier, cfg, fast):
    """Decoded 3-token continuations follow the target's exact distribution, on both paths (small default
    run; the slow test below runs 4000 per case)."""
    assert _chi_square_case(peaked_pair, spec, verifier, cfg, n=250, fast=fast) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("fast", [False, True], ids=["eager", "fast"])
@pytest.mark.parametrize(("spec", "verifier", "cfg"), CHI_CASES, ids=lambda x: str(x))
def test_chi_square_tiny_transformers_large(peaked_pair, spec, verifier, cfg, fast):
    assert _chi_square_case(peaked_pair, spec, verifier, cfg, n=4000, fast=fast) > 1e-3


def test_chi_square_catches_the_draft_distribution(peaked_pair):
    """The statistic has power at the default size: 250 sequences from the draft are rejected."""
    target, draft = peaked_pair
    cfg = SamplingConfig(1.0)
    counts = _draws(_exact_sequences(draft, [1, 4], 3, cfg), 250)
    assert _chi_square_p_value(counts, _exact_sequences(target, [1, 4], 3, cfg), 250) < 1e-3


GREEDY_POLICIES = ["autoregressive", "specdec:k=1", "specdec:k=4", "specdecpp:h=0.5,max=6",
                   "specdecpp:h=0.8,max=6,free=0", "confidence:tau=0.6,max=8", "oracle",
                   "entropy:tau=1.5,max=8", "adaedl:lam=0.5,max=8", "adaedl:lam=0.3,adapt=0,max=8"]


@pytest.mark.parametrize("fast", [False, True], ids=["eager", "fast"])
@pytest.mark.parametrize("verifier", ["token", "block"])
@pytest.mark.parametrize("spec", GREEDY_POLICIES)
def test_greedy_matches_transformers_generate(peaked_pair, spec, verifier, fast):
    target, draft = peaked_pair
    head = AcceptanceHead(draft.config.hidden_size, depth=2)
    dec = SpeculativeDecoder(target, draft, policy=spec, head=head, verifier=verifier, fast=fast,
                             compile=False)  # fmt: skip
    prompt = torch.tensor([[1, 4, 7]])
    for eos in (None, 5):
        ref = target.generate(prompt, max_new_tokens=24, do_sample=False, eos_token_id=eos, pad_token_id=0)
        res = dec.generate(prompt, max_new_tokens=24, temperature=0, eos_token_id=eos)
        assert res.new_ids.tolist() == ref[0, 3:].tolist()
        # Each round emits its accepted candidates + one token; only an accepted EOS drops that token.
        assert res.tokens == res.rounds + sum(res.accepted_per_round) or res.new_ids[-1] == eos
        assert res.drafted - res.discarded == sum(res.accepted_per_round) and res.target_calls == res.rounds
        if spec == "oracle":
            assert res.discarded == 0
