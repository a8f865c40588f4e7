"""Cascade drafting (DESIGN §6): the true q of lenient reviews, greedy equality, sampling exactness."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from conftest import make_tiny_llama

import acchead.inference.cascade as cascade_mod
from acchead.errors import AccheadError
from acchead.inference.cascade import CascadeDrafter, make_drafter, review_out_dists
from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.drafter_spec import CascadeSpec, MaGSpec, parse_drafter_spec, parse_k
from acchead.inference.drafters import Drafter
from acchead.inference.mag import MaxGram, build_bigram_table
from acchead.sampling import SamplingConfig, probs_from_logits


def _enumerated_law(r: torch.Tensor, p: torch.Tensor, leniency: float) -> torch.Tensor:
    """Law of one lenient review's emitted token, by enumerating the proposal x ~ r and the coin."""
    v = p.numel()
    out = torch.zeros(v, dtype=torch.float64)
    residual = (p - r).clamp_min(0).double()
    residual = residual / residual.sum() if residual.sum() > 0 else p.double()
    for x in range(v):
        if r[x] == 0:
            continue
        accept = min(1.0, leniency * float(p[x]) / float(r[x]))
        out[x] += float(r[x]) * accept
        out += float(r[x]) * (1 - accept) * residual
    return out


@pytest.mark.parametrize("leniency", [1.0, 1.5, 4.0])
def test_review_out_dists_is_the_true_law(leniency):
    g = torch.Generator().manual_seed(0)
    v = 6
    p = torch.softmax(torch.randn(4, v, generator=g) * 2, -1)
    p[0, 5] = 0.0  # p = 0 where r > 0
    p[0] /= p[0].sum()
    r = torch.softmax(torch.randn(3, v, generator=g) * 2, -1)
    r[1] = torch.nn.functional.one_hot(torch.tensor(2), v).float()  # MaG: one-hot proposal
    r[2, :3] = 0.0  # r = 0 where p > 0
    r[2] /= r[2].sum()
    laws = review_out_dists(r, p, leniency)
    assert laws.shape == (4, v)
    for i in range(3):
        torch.testing.assert_close(laws[i].double(), _enumerated_law(r[i], p[i], leniency), atol=1e-6, rtol=0)
    torch.testing.assert_close(laws[3], p[3])  # the bonus token comes from p
    if leniency == 1.0:
        # Speculative sampling's identity, computed the long way: the law is p itself.
        for i in range(3):
            torch.testing.assert_close(_enumerated_law(r[i], p[i], 1.0), p[i].double(), atol=1e-6, rtol=0)


def _mag(vocab: int) -> MaxGram:
    rng = np.random.default_rng(0)
    return MaxGram(build_bigram_table([rng.integers(0, vocab, size=300)], vocab))


def test_review_sampler_follows_the_reported_laws():
    """The lenient review's draws have exactly the laws it reports (position 1, and 2 given 1 accepted)."""
    v, leniency = 5, 2.0
    drafter = CascadeDrafter([], _mag(v), k=[[3]], leniency=leniency, vocab_size=v)
    drafter.begin(torch.tensor([1, 2]), SamplingConfig(temperature=1.0), 1)
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0], [0.0, 1.5, 0.2, 0.1, -0.5], [0.3, 0.3, 0.3, 0.3, 0.3]])
    one_hot = torch.eye(v)
    proposals = [(1, one_hot[1]), (1, one_hot[1])]
    n = 3000
    first = torch.zeros(v)
    second = torch.zeros(v)
    for _ in range(n):
        out = drafter._review(logits, proposals)
        first[out[0][0]] += 1
        if out[0][0] == 1 and len(out) > 1:
            second[out[1][0]] += 1
    laws = review_out_dists(one_hot[[1, 1]], probs_from_logits(logits, SamplingConfig()), leniency)
    # 4-sigma binomial bands
    for emp, law, m in ((first, laws[0], n), (second, laws[1], int(second.sum()))):
        sd = (law * (1 - law) / m).sqrt()
        assert ((emp / m - law).abs() <= 4 * sd + 1e-3).all(), (emp / m, law)


def _greedy(model, prompt: torch.Tensor, n: int) -> list[int]:
    out = model.generate(prompt[None], max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, prompt.numel():].tolist()


# The last case has the draft review nothing: it drafts autoregressively, a plain SpecDec round.
@pytest.mark.parametrize(
    ("k", "leniency"), [([[3, 2], [4]], 1.0), ([[2, 3], [6]], 3.0), ([[4, 0], [0]], 1.0)]
)
def test_greedy_cascade_equals_target_greedy(tiny_llama_pair, k, leniency):
    target, draft = tiny_llama_pair
    vocab = target.config.vocab_size
    prompt = torch.tensor([5, 17, 40, 5, 17, 40, 5, 17, 40, 5, 17])
    drafter = CascadeDrafter([draft], _mag(vocab), k=k, leniency=leniency, vocab_size=vocab)
    assert isinstance(drafter, Drafter)
    dec = SpeculativeDecoder(target, drafter, policy=f"specdec:k={sum(k[0])}")
    res = dec.generate(prompt, max_new_tokens=20, temperature=0)
    assert res.new_ids.tolist() == _greedy(target, prompt, 20)
    assert res.draft_calls == sum(drafter.calls_per_level) > 0


def test_two_reviewer_cascade_greedy_equals_target_greedy(tiny_llama_pair):
    target, draft = tiny_llama_pair
    vocab = target.config.vocab_size
    tiny = make_tiny_llama(vocab, hidden_size=16, num_layers=1, seed=3)
    # target round: draft-reviewed 2, then tiny-reviewed 2, then 1 raw MaG; the draft reviews 2 tokens of
    # tiny's and 1 of MaG's; tiny reviews 3 of MaG's.
    k = [[2, 2, 1], [2, 1], [3]]
    drafter = CascadeDrafter([draft, tiny], _mag(vocab), k=k, leniency=2.0, vocab_size=vocab)
    prompt = torch.tensor([3, 9, 27, 81, 3, 9, 27])
    res = SpeculativeDecoder(target, drafter, policy="specdec:k=5").generate(prompt, 16, temperature=0)
    assert res.new_ids.tolist() == _greedy(target, prompt, 16)
    assert all(c > 0 for c in drafter.calls_per_level)


# ------------------------------------------------------------------------------- sampling exactness

VOCAB = 8
S = SamplingConfig(temperature=1.0, top_k=2)  # support 2 per position: 2^3 outcomes for 3 tokens


@torch.inference_mode()
def _target_law(target, prompt: torch.Tensor, n: int) -> dict[tuple[int, ...], float]:
    """Exact law of the target's first n sampled tokens, by enumeration over the top-k support."""
    law: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for seq, pr in law.items():
            ctx = torch.cat([prompt, torch.tensor(seq, dtype=torch.long)])
            p = probs_from_logits(target(input_ids=ctx[None]).logits[0, -1], S)
            for y in torch.nonzero(p).flatten().tolist():
                nxt[(*seq, y)] = pr * float(p[y])
        law = nxt
    return law


def _chi_square_pvalue(counts: dict, law: dict, n: int) -> float:
    stat = sum((counts.get(c, 0) - n * p) ** 2 / (n * p) for c, p in law.items())
    assert set(counts) <= set(law), "a sequence the target cannot produce"
    dof = len(law) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(stat / 2)))


@torch.inference_mode()
def _cascade_samples(target, draft, prompt, runs: int) -> dict:
    drafter = CascadeDrafter([draft], _mag(VOCAB), k=[[2, 1], [2]], leniency=2.0, vocab_size=VOCAB)
    dec = SpeculativeDecoder(target, drafter, policy="specdec:k=3")
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(runs):
        ids = dec.generate(prompt, 3, temperature=S.temperature, top_k=S.top_k, seed=seed).new_ids.tolist()
        counts[tuple(ids)] = counts.get(tuple(ids), 0) + 1
    return counts


def test_sampling_cascade_samples_the_target_and_catches_a_wrong_q(monkeypatch):
    """Chi-square over the 8 three-token outcomes; the negative control reports the reviewer's own
    distribution as q (ignoring leniency), which is the bug the true-q bookkeeping prevents."""
    target = make_tiny_llama(VOCAB, hidden_size=32, num_layers=2, seed=11)
    draft = make_tiny_llama(VOCAB, hidden_size=32, num_layers=1, seed=12)
    # A prompt where leniency matters: MaG's first proposal is inside the draft's top-2.
    mag = _mag(VOCAB)
    prompt = None
    for cand in itertools.product(range(1, VOCAB), repeat=2):
        ctx = torch.tensor([*cand, *cand, cand[0]])
        proposal = mag.propose(ctx.numpy(), ctx.numel(), 1)[0]
        with torch.inference_mode():
            q = probs_from_logits(draft(input_ids=ctx[None]).logits[0, -1], S)
        if q[proposal] > 0:
            prompt = ctx
            break
    assert prompt is not None
    law = _target_law(target, prompt, 3)
    runs = 400
    good = _cascade_samples(target, draft, prompt, runs)
    assert _chi_square_pvalue(good, law, runs) > 1e-3
    # The wrong q misses by far (measured at 600 runs: the p-value underflows to 0), so 120 runs do.
    monkeypatch.setattr(cascade_mod, "review_out_dists", lambda r, p, leniency: p.clone())
    bad = _cascade_samples(target, draft, prompt, 120)
    assert _chi_square_pvalue(bad, law, 120) < 1e-6


def test_bad_k_and_drafter_specs(tiny_llama_pair):
    target, draft = tiny_llama_pair
    vocab = target.config.vocab_size
    mag = _mag(vocab)
    with pytest.raises(AccheadError):
        CascadeDrafter([draft], mag, k=[[3, 2]], vocab_size=vocab)  # missing the draft's row
    with pytest.raises(AccheadError):
        CascadeDrafter([draft], mag, k=[[0, 0], [3]], vocab_size=vocab)  # target round drafts nothing
    with pytest.raises(AccheadError):
        CascadeDrafter([draft], mag, k=[[3, 1], [3]], leniency=0.5, vocab_size=vocab)
    assert parse_k("4.2/10") == ((4, 2), (10,))
    with pytest.raises(AccheadError):
        parse_k("4,2/x")
    # typed drafter specs: parsed (checked) before any model is built, written back without defaults
    assert parse_drafter_spec("cascade:k=4.2/10,l=1.5") == CascadeSpec(((4, 2), (10,)), 1.5)
    assert parse_drafter_spec("mag") == MaGSpec() and MaGSpec(6).to_spec() == "mag:block=6"
    for text in ("mag", "mag:block=6", "cascade:k=4.2/10", "cascade:k=3/7,l=2.5"):
        assert parse_drafter_spec(text).to_spec() == text
    for bad in ("mag:block=0", "cascade:k=0/3", "cascade:k=3/4,l=0"):
        with pytest.raises(AccheadError):
            parse_drafter_spec(bad)
    d = make_drafter("cascade:k=4.2/10,l=1.5", draft=draft, bigram=mag.bigram, vocab_size=vocab)
    assert isinstance(d, CascadeDrafter) and d.k == [[4, 2], [10]] and d.leniency == 1.5
    assert make_drafter("mag:block=6", draft=None, bigram=mag.bigram, vocab_size=vocab).block == 6
    for bad in ("cascade:l=2", "cascade:k=4.2/10,x=1", "ngram:k=3", "mag:block=x"):
        with pytest.raises(AccheadError):
            make_drafter(bad, draft=draft, bigram=mag.bigram, vocab_size=vocab)
    with pytest.raises(AccheadError):
        make_drafter("cascade:k=4.2/10", draft=None, bigram=mag.bigram, vocab_size=vocab)


@pytest.mark.slow
def test_sampling_bandit_over_drafters_samples_the_target():
    """Rounds switching between the draft model, MaG and a lenient cascade still sample the target."""
    from acchead.inference.bandit_decoder import bandit_decoder

    target = make_tiny_llama(VOCAB, hidden_size=32, num_layers=2, seed=11)
    draft = make_tiny_llama(VOCAB, hidden_size=32, num_layers=1, seed=12)
    prompt = torch.tensor([1, 2, 1, 2, 1])
    law = _target_law(target, prompt, 3)
    spec = "exp3:arms=specdec:k=1|mag:block=2@specdec:k=2|cascade:k=1.1/2,l=2@specdec:k=2"
    dec = bandit_decoder(target, draft, spec, bigram=_mag(VOCAB).bigram)
    runs = 800
    counts: dict[tuple[int, ...], int] = {}
    with torch.inference_mode():
        for seed in range(runs):
            ids = dec.generate(prompt, 3, temperature=S.temperature, top_k=S.top_k, seed=seed).new_ids
            counts[tuple(ids.tolist())] = counts.get(tuple(ids.tolist()), 0) + 1
    assert _chi_square_pvalue(counts, law, runs) > 1e-3
