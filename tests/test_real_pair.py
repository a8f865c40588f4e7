"""Exactness on the real pair (SmolLM2-135M-Instruct and its reduced-vocabulary draft): the first tokens
of sampled decodes follow the target's exact distribution (chi-square), and greedy decodes equal the
target's own greedy text. Slow, and only where `acchead-assets` installed the target; the draft is the
shipped one when it exists, else one made from the target's layers on the spot (untrained: exactness must
hold for any draft, and an untrained one disagrees more, which tests the residual harder)."""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path

import pytest
import torch
from exact_models import _chi_square_p_value, _exact_sequences

from acchead.feature_draft import is_feature_draft
from acchead.head import AcceptanceHead
from acchead.inference.decoder import SpeculativeDecoder
from acchead.models import load_causal_lm, load_tokenizer
from acchead.prompting import encode_prompt
from acchead.sampling import SamplingConfig

pytestmark = pytest.mark.slow


@functools.cache
def _load_pair(target_dir: Path):
    from acchead.distill.draft import init_from_target
    from acchead.pairs import SMOLLM2_DRAFT_DIR

    target, tok = load_causal_lm(target_dir), load_tokenizer(target_dir)
    if (SMOLLM2_DRAFT_DIR / "config.json").is_file():
        draft = load_causal_lm(SMOLLM2_DRAFT_DIR)
    else:
        draft = init_from_target(target, torch.arange(8192), (0, 29), str(target_dir))
    return target, draft.eval(), tok


@pytest.fixture
def real_pair(real_assets):
    """(target, draft, tokenizer), loaded once per test run."""
    return _load_pair(real_assets["smollm2-target"])


@pytest.mark.parametrize(
    ("spec", "verifier", "cfg"),
    [("specdec:k=3", "token", SamplingConfig(1.0)),
     ("specdecpp:h=0.5,max=4", "block", SamplingConfig(1.0, 50))],
    ids=str,
)  # fmt: skip
def test_first_tokens_follow_the_target(real_pair, spec, verifier, cfg):
    """The first drafted token's law: a feature draft drafts from the second token on (the first round is
    the target's alone), so there the second token is tested, given the most frequent first one."""
    target, draft, tok = real_pair
    prompt = encode_prompt(tok, "Name a colour.", chat=True)
    dec = SpeculativeDecoder(target, draft, policy=spec, head=AcceptanceHead(576, depth=1), verifier=verifier,
                             fast=False)  # fmt: skip
    m, n = (2, 800) if is_feature_draft(draft) else (1, 400)
    samples = [
        tuple(dec.generate(torch.tensor(prompt), max_new_tokens=m, temperature=cfg.temperature,
                           top_k=cfg.top_k, seed=s).new_ids.tolist())
        for s in range(n)
    ]  # fmt: skip
    prefix = Counter(x[: m - 1] for x in samples).most_common(1)[0][0]  # () when m = 1
    kept = [x[m - 1 :] for x in samples if x[: m - 1] == prefix and len(x) == m]
    exact = _exact_sequences(target, [*prompt, *prefix], 1, cfg)
    assert len(kept) >= 100 and len([k for k, p in exact.items() if len(kept) * p >= 5]) >= 3
    assert _chi_square_p_value(Counter(kept), exact, len(kept)) > 1e-3


@pytest.mark.parametrize("spec", ["specdec:k=3", "specdecpp:h=0.7,max=8"])
def test_greedy_equals_the_targets_greedy(real_pair, spec):
    target, draft, tok = real_pair
    dec = SpeculativeDecoder(target, draft, policy=spec, head=AcceptanceHead(576, depth=1), fast=False)
    for text, chat in (("Write a haiku about the sea.", True), ("def fibonacci(n):", False)):
        prompt = torch.tensor([encode_prompt(tok, text, chat=chat)])
        ref = target.generate(prompt, max_new_tokens=32, do_sample=False, pad_token_id=tok.eos_token_id)
        res = dec.generate(prompt, max_new_tokens=32, temperature=0)
        assert res.new_ids.tolist() == ref[0, prompt.shape[1] :].tolist()


def test_the_shipped_head_is_for_the_shipped_draft(real_pair):
    """The real pair's shipped heads load against the shipped draft (its fingerprint reads the target's
    embedding, hence here): `acchead-decode --pair smollm2`'s default SpecDec++ decodes with the greedy one
    the target's own greedy text, and with the T = 1 one samples."""
    from acchead.head_io import load_head
    from acchead.pairs import SMOLLM2_DRAFT_DIR, default_heads

    if not (SMOLLM2_DRAFT_DIR / "config.json").is_file():
        pytest.skip("no shipped draft")
    target, draft, tok = real_pair
    (path,) = default_heads("smollm2", SamplingConfig(0.0))
    head, _ = load_head(path, draft=draft)  # AccheadError if recorded for another draft
    dec = SpeculativeDecoder(target, draft, policy="specdecpp:h=0.7", head=head, fast=False)
    prompt = torch.tensor([encode_prompt(tok, "Write a haiku about the sea.", chat=True)])
    ref = target.generate(prompt, max_new_tokens=32, do_sample=False, pad_token_id=tok.eos_token_id)
    res = dec.generate(prompt, max_new_tokens=32, temperature=0)
    assert res.new_ids.tolist() == ref[0, prompt.shape[1] :].tolist() and dec.policy_run.head_calls > 0
    # the T = 1 head too: recorded for this draft, and it reads the draft's state as it decodes
    (path,) = default_heads("smollm2", SamplingConfig(1.0))
    head, meta = load_head(path, draft=draft)
    assert "state" in meta.inputs
    dec = SpeculativeDecoder(target, draft, policy="specdecpp:h=0.5", head=head, fast=False)
    res = dec.generate(prompt, max_new_tokens=32, temperature=1.0, seed=0)
    assert len(res.new_ids) > 0 and dec.policy_run.head_calls > 0
