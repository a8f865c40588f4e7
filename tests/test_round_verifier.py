"""The target's side of a round (acchead.inference.round_verifier): one unit verifies the candidates and
packs the status; q is padded to the target's vocabulary, never truncated."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from acchead.errors import AccheadError
from acchead.inference.drafters import DraftStep
from acchead.inference.model_runner import make_runner
from acchead.inference.round_verifier import RoundVerifier
from acchead.inference.verification import VERIFIERS
from acchead.sampling import SamplingConfig


def _verifier(target) -> RoundVerifier:
    vocab = target.get_output_embeddings().weight.shape[0]
    runner = make_runner(target, False, False)
    return RoundVerifier(runner, VERIFIERS["token"], vocab, target.device, key_tensors=False)


def _step(token: int, width: int, index: int) -> DraftStep:
    return DraftStep(token=torch.tensor(token), q=F.one_hot(torch.tensor(token), width).float(), hidden=None,
                     index=index)  # fmt: skip


def test_greedy_status_is_the_agreeing_prefix_then_the_targets_token(tiny_llama_pair):
    target, _ = tiny_llama_pair
    prompt = torch.tensor([5, 17, 40, 99])
    greedy = target.generate(prompt[None], max_new_tokens=3, do_sample=False)[0, 4:].tolist()
    wrong = (greedy[2] + 1) % target.config.vocab_size
    verifier = _verifier(target)
    vocab = verifier.vocab
    seq = torch.tensor([*prompt.tolist(), greedy[0], greedy[1], wrong, 0])
    steps = [_step(t, vocab, i + 1) for i, t in enumerate((greedy[0], greedy[1], wrong))]
    verifier.runner.reset(8)
    status = verifier.verify(seq, 4, steps, SamplingConfig(0.0), seed=0).tolist()
    assert status == [2, greedy[2], greedy[0], greedy[1], wrong]
    assert seq[6].item() == greedy[2]  # the next token is written after the accepted candidates
    assert verifier.runner.length == 7  # the cache saw prompt + candidates; the caller rolls it back


def test_q_is_padded_to_the_targets_vocabulary_and_a_wider_one_refused(tiny_llama_pair):
    target, _ = tiny_llama_pair
    verifier = _verifier(target)
    narrow = verifier.stack_q([_step(3, verifier.vocab - 2, 1)])
    assert narrow.shape == (1, verifier.vocab) and narrow[0, 3] == 1 and narrow.sum() == 1
    assert verifier.stack_q([]).shape == (0, verifier.vocab)
    with pytest.raises(AccheadError, match="wider than the target's"):
        verifier.stack_q([_step(3, verifier.vocab + 1, 1)])


def test_cheapest_widths_pad_a_count_only_to_a_clearly_faster_width():
    """The measured ladder: a count goes to a wider unit only when it was timed more than 5% faster (the
    AMD box's SmolLM2 units: widths 2 and 3 slower than 4), never past the padding slack, and a count whose
    own width was not timed gets no entry."""
    from acchead.inference.round_verifier import PAD_SLACK, cheapest_widths

    assert cheapest_widths({1: 56.0, 2: 71.0, 3: 84.0, 4: 70.0}) == {1: 1, 2: 2, 3: 4, 4: 4}
    assert cheapest_widths({1: 56.0, 2: 80.0, 3: 84.0, 4: 70.0}) == {1: 1, 2: 4, 3: 4, 4: 4}
    assert cheapest_widths({1: 50.0, 2: 60.0}) == {1: 1, 2: 2}
    far = 2 + PAD_SLACK + 1
    assert cheapest_widths({2: 100.0, far: 1.0}).get(2) == 2
    assert 5 not in cheapest_widths({4: 10.0, 8: 10.0})  # its own width, 6, untimed


def test_padded_fast_path_decodes_the_same_tokens_at_measured_widths(tiny_llama_pair):
    """Counts verified at a wider width than the ladder's (as `warm_up` chooses when it is faster) give the
    same greedy tokens, and the same sampled ones, as the ladder's widths (uncompiled static caches)."""
    from acchead.inference.decoder import SpeculativeDecoder

    target, draft = tiny_llama_pair
    prompt = torch.tensor([5, 17, 40, 99])
    ladder = SpeculativeDecoder(target, draft, policy="specdec:k=3", fast=True, compile=False)
    wide = SpeculativeDecoder(target, draft, policy="specdec:k=3", fast=True, compile=False)
    wide._verifier.widths = {1: 1, 2: 4, 3: 4, 4: 4}
    fed = []
    feed = wide._verifier.runner.feed
    wide._verifier.runner.feed = lambda tokens, *a, **k: fed.append(tokens.numel()) or feed(tokens, *a, **k)
    for temperature, seed in ((0.0, 0), (1.0, 1), (1.0, 2)):
        a = ladder.generate(prompt, max_new_tokens=16, temperature=temperature, seed=seed)
        b = wide.generate(prompt, max_new_tokens=16, temperature=temperature, seed=seed)
        assert a.new_ids.tolist() == b.new_ids.tolist() and a.accepted_per_round == b.accepted_per_round
    assert 4 in fed and not {2, 3} & set(fed[1:])
