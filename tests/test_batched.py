"""Batched decoding (issue 33): every row of a batch decodes exactly what it would alone.

- the ragged cache: holes, rollback and compaction leave each row's logits those of the row alone;
- greedy: each row equals `target.generate(do_sample=False)` on its prompt alone, for ragged prompts, rows
  ending at EOS / their own max tokens / a stop check at different rounds, every policy and verifier, with
  and without the batch stop rule;
- sampling: without the batch rule a row's tokens are the single-prompt decoder's with the same seed; with
  it (round lengths then depend on the other rows) a chi-square test of a row's 3-token continuations
  against the target's exact distribution;
- the batch stop rule on hand-computed cases.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from exact_models import _chi_square_p_value, _exact_sequences, _peaked_llama, _perturbed
from test_feature_draft import trained_feature_pair

from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.inference import SpeculativeDecoder
from acchead.inference.batch_stop import BatchStop, parse_batch_stop
from acchead.inference.batched import BatchedDecoder
from acchead.inference.ragged_cache import RaggedCache
from acchead.sampling import SamplingConfig

PROMPTS = [[1, 4, 7], [2], [3, 5, 7, 9, 11, 2, 6], [1, 4]]
MAX_NEW = [20, 7, 24, 1]


@pytest.fixture(scope="module")
def peaked_pair():
    target = _peaked_llama(12, seed=3)
    return target, _perturbed(target, 0.5, seed=4)


def _heads(hidden: int) -> dict[str, AcceptanceHead]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return {
            "candidate": AcceptanceHead(hidden, depth=2),
            "lookahead": AcceptanceHead(hidden, depth=1, kind="lookahead", inputs=("state", "logq", "token")),
            # narrower than the draft's state (`--width`): the batched step runs a projected head too
            "narrow": AcceptanceHead(
                hidden, depth=1, kind="lookahead", inputs=("state", "logq", "token"), width=hidden // 2
            ),
            # the draft's statistics alone, no state (the real pair's demo head)
            "stats": AcceptanceHead(hidden, depth=1, kind="lookahead", inputs=("logq", "entropy", "topk")),
        }


# (policy, head kind or None)
POLICIES = [
    ("autoregressive", None),
    ("specdec:k=1", None),
    ("specdec:k=4", None),
    ("specdecpp:h=0.5,max=6", "candidate"),
    ("specdecpp:h=0.8,max=6,free=0", "candidate"),
    ("specdecpp:h=0.6,max=6", "lookahead"),
    ("specdecpp:h=0.6,max=6", "stats"),
    ("confidence:tau=0.6,max=6", None),
    ("entropy:tau=1.0,max=6", None),
    ("adaedl:lam=0.6,max=6", None),  # online λ: each row its own, moved after each of its rounds
    ("adaedl:lam=0.3,adapt=0,max=6", None),
]


def _decoder(pair, spec, kind, **kw) -> BatchedDecoder:
    target, draft = pair
    head = _heads(draft.config.hidden_size)[kind] if kind else None
    return BatchedDecoder(target, None if spec == "autoregressive" else draft, spec, head=head, **kw)


# ------------------------------------------------------------------------------------------- the cache


@torch.inference_mode()
def test_ragged_cache_rows_equal_the_row_alone(peaked_pair):
    """Ragged feeds, per-row rollbacks (holes), finished rows leaving and compaction: each row's logits
    after each feed equal one unbatched forward over the row's kept tokens."""
    target, _ = peaked_pair
    check_ragged_cache(RaggedCache(target), target)


def check_ragged_cache(cache, target) -> None:
    """`test_ragged_cache_rows_equal_the_row_alone` on `cache` (a `RaggedCache` or its static twin)."""
    g = torch.Generator().manual_seed(0)
    rows: list[list[int]] = [[], [], []]
    cache.reset(len(rows))
    compactions: list[int] = []
    compact = cache._compact
    cache._compact = lambda longest: (compactions.append(longest), compact(longest))  # count them
    for step in range(30):
        counts = torch.randint(0 if step else 1, 4, (len(rows),), generator=g)
        counts[0] = max(int(counts[0]), 1)  # row 0 always feeds (some row must: a forward needs a token)
        width = int(counts.max())
        tokens = torch.randint(0, 12, (len(rows), width), generator=g)
        logits, _ = cache.feed(tokens, counts, keep=1)
        for b, row in enumerate(rows):
            row += tokens[b, width - int(counts[b]) :].tolist()
            if counts[b] > 0:
                ref = target(input_ids=torch.tensor([row])).logits[0, -1]
                assert torch.allclose(logits[b, -1], ref, atol=1e-5), (step, b)
        assert torch.isfinite(logits).all()
        # Roll every row back by a random amount (≥ 1 token kept): rejected candidates become holes.
        keep = [max(1, len(r) - int(torch.randint(0, 3, (), generator=g))) for r in rows]
        cache.rollback(torch.tensor(keep))
        rows = [r[:k] for r, k in zip(rows, keep, strict=True)]
        assert cache.length.tolist() == [len(r) for r in rows]
        if step == 15:  # row 1 finishes and leaves the batch
            cache.select(torch.tensor([0, 2]))
            rows = [rows[0], rows[2]]
    assert cache.mask.sum(1).tolist() == [len(r) for r in rows]
    assert compactions  # the holes did pile up, and compacting them kept every row's logits


# ------------------------------------------------------------------------------------------- greedy


# The batch rule reads the heads' P̂: specdecpp only.
GREEDY_CASES = [(spec, kind, rule) for spec, kind in POLICIES for rule in ((False, True)[: 1 + bool(kind)])]
GREEDY_CASES.append(("specdecpp:h=0.6,max=6", "narrow", True))


@pytest.mark.parametrize("verifier", ["token", "block"])
@pytest.mark.parametrize(("spec", "kind", "batch_stop"), GREEDY_CASES, ids=lambda x: str(x))
def test_greedy_rows_equal_generate_alone(peaked_pair, spec, kind, batch_stop, verifier):
    target, _ = peaked_pair
    dec = _decoder(peaked_pair, spec, kind, verifier=verifier, batch_stop=batch_stop)
    for eos in (None, 5):
        res = dec.generate(PROMPTS, max_new_tokens=MAX_NEW, temperature=0, eos_token_id=eos)
        for b, prompt in enumerate(PROMPTS):
            ref = target.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW[b], do_sample=False,
                                  eos_token_id=eos, pad_token_id=0)[0, len(prompt) :]  # fmt: skip
            row = res.rows[b]
            assert row.new_ids.tolist() == ref.tolist(), (b, eos)
            # Each round emits its accepted candidates + one token; only an accepted EOS drops that token.
            assert row.tokens == row.rounds + sum(row.accepted_per_round) or row.new_ids[-1] == eos
            assert row.drafted - row.discarded == sum(row.accepted_per_round)
        assert res.target_calls == max(r.rounds for r in res.rows)
        if spec == "autoregressive":
            assert res.draft_calls == 0 and all(r.drafted == 0 for r in res.rows)


def test_greedy_stop_checks_end_rows_at_different_rounds(peaked_pair):
    """A per-row stop check (how stop strings end a row) cuts that row only; the others go on unchanged."""
    dec = _decoder(peaked_pair, "specdec:k=3", None)
    alone = dec.generate(PROMPTS, max_new_tokens=20, temperature=0)
    stop_at = alone.rows[0].new_ids[4].item()  # row 0 ends at its 5th token, whatever round brings it

    def check(new: list[int]) -> int | None:
        return new.index(stop_at) + 1 if stop_at in new else None

    res = dec.generate(PROMPTS, max_new_tokens=20, temperature=0, stop_checks=[check, None, None, None])
    assert res.rows[0].new_ids.tolist() == alone.rows[0].new_ids[:5].tolist()
    for b in range(1, len(PROMPTS)):
        assert res.rows[b].new_ids.tolist() == alone.rows[b].new_ids.tolist()


# ------------------------------------------------------------------------------------------- sampling


def _assert_sampled_rows_are_the_single_decoders(dec: BatchedDecoder, single: SpeculativeDecoder, prompts):
    """Row b of a sampled batch (seed 10 + b) has the single-prompt decoder's tokens and rounds."""
    res = dec.generate(prompts, max_new_tokens=12, temperature=0.9, top_k=8, seed=10, eos_token_id=5)
    for b, prompt in enumerate(prompts):
        ref = single.generate(torch.tensor(prompt), max_new_tokens=12, temperature=0.9, top_k=8, seed=10 + b,
                              eos_token_id=5)  # fmt: skip
        assert res.rows[b].new_ids.tolist() == ref.new_ids.tolist(), b
        assert res.rows[b].accepted_per_round == ref.accepted_per_round
        assert res.rows[b].drafted_per_round == ref.drafted_per_round


@pytest.mark.parametrize("prompts", [PROMPTS, PROMPTS[2:3]], ids=["B4", "B1"])
@pytest.mark.parametrize("verifier", ["token", "block"])
@pytest.mark.parametrize(("spec", "kind"), POLICIES, ids=lambda x: str(x))
def test_sampling_rows_equal_the_single_prompt_decoder(peaked_pair, spec, kind, verifier, prompts):
    """Without the batch rule, row b draws with the single decoder's keys under seed + b: same tokens, same
    rounds (a float tie between batched and unbatched logits could break this; none occurs here)."""
    target, draft = peaked_pair
    dec = _decoder(peaked_pair, spec, kind, verifier=verifier)
    single = SpeculativeDecoder(target, None if spec == "autoregressive" else draft, spec,
                                head=dec._rule.head, verifier=verifier, fast=False)  # fmt: skip
    _assert_sampled_rows_are_the_single_decoders(dec, single, prompts)


@pytest.mark.parametrize(
    ("spec", "kind", "verifier"),
    [("specdecpp:h=0.5,max=3", "candidate", "block"), ("specdecpp:h=0.4,max=3", "lookahead", "token")],
    ids=["candidate-block", "lookahead-token"],
)
def test_chi_square_batched_row_with_batch_rule(peaked_pair, spec, kind, verifier):
    """Row 1 of a ragged batch of 3, with the batch rule (c = 0.3) deciding round lengths from all rows'
    heads: its 3-token continuations follow the target's exact distribution."""
    target, _ = peaked_pair
    dec = _decoder(peaked_pair, spec, kind, verifier=verifier, batch_stop=0.3)
    counts, results = sample_row_one(dec)
    assert sum(res.batch_stops for res in results) > 0  # the rule really ended rounds
    assert row_one_p_value(target, counts) > 1e-3


CHI_PROMPTS, CHI_SAMPLES = [[3, 5, 7, 9], [1, 4], [2]], 250


def sample_row_one(dec: BatchedDecoder) -> tuple[Counter, list]:
    """CHI_SAMPLES sampled decodes (T = 1) of the ragged batch CHI_PROMPTS, each with its own seeds: the
    counts of row 1's 3-token continuations, and every decode's `BatchResult`."""
    counts: Counter = Counter()
    results = []
    for s in range(CHI_SAMPLES):
        res = dec.generate(CHI_PROMPTS, max_new_tokens=[5, 3, 4], temperature=1.0, seed=[7 * s, s, 3 * s + 1])
        counts[tuple(res.rows[1].new_ids.tolist())] += 1
        results.append(res)
    return counts, results


def row_one_p_value(target, counts: Counter) -> float:
    """The chi-square p-value of row 1's continuations against the target's exact 3-token distribution."""
    exact = _exact_sequences(target, CHI_PROMPTS[1], 3, SamplingConfig(1.0))
    return _chi_square_p_value(counts, exact, CHI_SAMPLES)


def test_chi_square_batched_row_catches_a_wrong_row(peaked_pair):
    """Power check: the same statistic on row 0's continuations (another prompt) rejects them."""
    target, _ = peaked_pair
    dec = _decoder(peaked_pair, "autoregressive", None)
    counts = Counter(
        tuple(dec.generate([[3, 5, 7, 9], [1, 4]], max_new_tokens=3, temperature=1.0, seed=2 * s).rows[0]
              .new_ids.tolist())
        for s in range(250)
    )  # fmt: skip
    assert _chi_square_p_value(counts, _exact_sequences(target, [1, 4], 3, SamplingConfig(1.0)), 250) < 1e-3


# ------------------------------------------------------------------------------------------- the rule


def test_batch_stop_rule_hand_computed():
    """Continue iff Σ_{drafting} P̂_b > c·B (docs/batched.md)."""
    rule = BatchStop(0.2)
    log = torch.log(torch.tensor([0.9, 0.5, 0.05, 0.3], dtype=torch.float64))
    drafting = torch.tensor([True, True, True, False])
    assert math.isclose(rule.gain(log, drafting), 1.45)
    assert not rule.should_stop(log, drafting, 4)  # 1.45 > 0.8
    assert rule.should_stop(log, drafting, 8)  # 1.45 ≤ 1.6: four more rows wait, the forward costs them too
    only_low = torch.tensor([False, False, True, True])
    assert rule.should_stop(log, only_low, 4)  # 0.05 ≤ 0.8: the row at 0.3 has stopped, it adds nothing
    # B = 1 is the paper's rule with h = 1 − c: continue iff P̂ > c.
    one = BatchStop.from_h(0.8)
    assert math.isclose(one.c, 0.2) and math.isclose(one.h, 0.8)
    for p_hat in (0.15, 0.19, 0.21, 0.5):
        stop = one.should_stop(torch.tensor([math.log(p_hat)]), torch.tensor([True]), 1)
        assert stop == (1 - p_hat > 0.8)


def test_parse_batch_stop():
    assert parse_batch_stop(None, 0.8) is None and parse_batch_stop(False, 0.8) is None
    assert parse_batch_stop("off", 0.8) is None
    assert math.isclose(parse_batch_stop(True, 0.7).c, 0.3)
    assert math.isclose(parse_batch_stop("0.25", None).c, 0.25)
    for bad in ("1.5", "x", 0.0):
        with pytest.raises(AccheadError):
            parse_batch_stop(bad, 0.8)
    with pytest.raises(AccheadError, match="specdecpp"):
        parse_batch_stop(True, None)


def test_batch_rule_saves_draft_forwards(peaked_pair):
    """With rows that disagree on when to stop, the batch rule ends rounds earlier: fewer batched draft
    forwards than the rows' own rule, same greedy tokens."""
    prompts = [[1, 4, 7], [2], [3, 5, 7, 9], [1, 4], [6, 6], [8]]
    plain = _decoder(peaked_pair, "specdecpp:h=0.5,max=8", "candidate").generate(prompts, 24, temperature=0)
    ruled = _decoder(peaked_pair, "specdecpp:h=0.5,max=8", "candidate", batch_stop=True)
    res = ruled.generate(prompts, 24, temperature=0)
    assert res.batch_stops > 0 and res.draft_calls < plain.draft_calls
    assert [r.new_ids.tolist() for r in res.rows] == [r.new_ids.tolist() for r in plain.rows]


def test_refuses_what_it_cannot_batch(peaked_pair):
    with pytest.raises(AccheadError, match="batched decoding runs"):
        _decoder(peaked_pair, "ucb:arms=specdec:k=1|specdec:k=3", None)
    with pytest.raises(AccheadError, match="needs a draft"):
        BatchedDecoder(peaked_pair[0], None, "specdec:k=2")
    dec = _decoder(peaked_pair, "specdec:k=2", None)
    with pytest.raises(AccheadError, match="one max_new_tokens"):
        dec.generate(PROMPTS, max_new_tokens=[3, 4])
    with pytest.raises(AccheadError, match="non-empty"):
        dec.generate([[1], []], max_new_tokens=4)


# ------------------------------------------------------------------------------------ a feature draft

@pytest.fixture(scope="module")
def feature_pair(tmp_path_factory):
    return trained_feature_pair(tmp_path_factory)


FEATURE_POLICIES = [
    ("specdec:k=1", None),
    ("specdec:k=3", None),
    ("specdecpp:h=0.5,max=5", "candidate"),
    ("specdecpp:h=0.6,max=5", "lookahead"),
    ("confidence:tau=0.6,max=5", None),
]


@pytest.mark.parametrize("verifier", ["token", "block"])
@pytest.mark.parametrize(("spec", "kind"), FEATURE_POLICIES, ids=lambda x: str(x))
def test_feature_draft_rows_equal_generate_and_the_single_prompt_decoder(feature_pair, spec, kind, verifier):
    """A feature (EAGLE) draft in a ragged batch: greedy rows equal the target's `generate` on each prompt
    alone, and sampled rows the single-prompt decoder's (its `FeatureDrafter`) under the same seeds, rounds
    included, so the batched feed hands every row the target's states exactly as the one-row path does."""
    target, draft = feature_pair
    dec = _decoder(feature_pair, spec, kind, verifier=verifier)
    res = dec.generate(PROMPTS, max_new_tokens=MAX_NEW, temperature=0, eos_token_id=5)
    for b, prompt in enumerate(PROMPTS):
        ref = target.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW[b], do_sample=False,
                              eos_token_id=5, pad_token_id=0)[0, len(prompt) :]  # fmt: skip
        assert res.rows[b].new_ids.tolist() == ref.tolist(), b
    assert sum(sum(r.accepted_per_round) for r in res.rows) > 0  # it drafted and was accepted
    assert all(r.drafted_per_round[0] == 0 for r in res.rows)  # the first round has no states to draft from
    single = SpeculativeDecoder(target, draft, spec, head=dec._rule.head, verifier=verifier, fast=False)
    _assert_sampled_rows_are_the_single_decoders(dec, single, PROMPTS)


def test_autoregressive_rows_keep_no_feature_draft_cache(feature_pair):
    """Batched AR with a feature draft beside it: no draft cache, no target states handed over (AR is the
    baseline every speedup divides by), and each row the target's greedy decoding of its prompt."""
    target, draft = feature_pair
    dec = BatchedDecoder(target, draft, "autoregressive")
    assert dec._feed is None
    res = dec.generate(PROMPTS, max_new_tokens=MAX_NEW, temperature=0, eos_token_id=5)
    for b, prompt in enumerate(PROMPTS):
        ref = target.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW[b], do_sample=False,
                              eos_token_id=5, pad_token_id=0)[0, len(prompt) :]  # fmt: skip
        assert res.rows[b].new_ids.tolist() == ref.tolist(), b
        assert res.rows[b].draft_calls == 0


def test_adaedl_rows_move_their_own_lambda_as_they_would_alone(peaked_pair):
    """AdaEDL's online λ with large steps (ε = 0.2, no smoothing, target α = 0.5), so λ swings round by
    round and changes where rounds stop: each row of a ragged batch still drafts, round by round, what the
    single-prompt decoder drafts for its prompt (its λ is its own, moved only by its own rounds)."""
    from acchead.inference.adaedl import AdaEDL

    target, draft = peaked_pair
    policy = AdaEDL(lam=0.2, max_draft=6, eps=0.2, beta2=0.0, target=0.5)
    dec = BatchedDecoder(target, draft, policy)
    single = SpeculativeDecoder(target, draft, policy, fast=False)
    res = dec.generate(PROMPTS, max_new_tokens=MAX_NEW, temperature=1.0, seed=3)
    lengths = set()
    for b, prompt in enumerate(PROMPTS):
        ref = single.generate(torch.tensor(prompt), max_new_tokens=MAX_NEW[b], temperature=1.0, seed=3 + b)
        assert res.rows[b].drafted_per_round == ref.drafted_per_round, b
        assert res.rows[b].new_ids.tolist() == ref.new_ids.tolist(), b
        lengths |= set(ref.drafted_per_round[1:])
    assert len(lengths) > 2  # λ did move round lengths
