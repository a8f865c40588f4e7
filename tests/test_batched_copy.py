"""Copy rounds in a batch (`acchead.inference.batched_copy`): each row copies its context where its suffix
recurs while the other rows draft, and every row still decodes exactly what it would alone.

- greedy: each row equals the target's `generate` on its prompt alone, with a model draft and a feature draft,
  and a round holds copying and drafting rows side by side;
- sampling: row b's tokens and rounds are the single-prompt decoder's with copy rounds under seed + b (its
  copy rounds are exact: tests/test_copy_drafter.py), AdaEDL's λ moved by the policy's rounds only; with the
  batch rule (round lengths then depend on the other rows), a chi-square test of a row's continuations;
- the fast path's static caches (uncompiled, and compiled through the `cudagraphs` backend) give the eager
  batch's rows, the draft catching up after copy rounds beyond its compiled widths;
- what copy rounds refuse, and `acchead-decode --batch-size` with them.
"""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import torch
from exact_models import _chi_square_p_value, _exact_sequences, _peaked_llama, _perturbed
from test_copy_drafter import _feature_draft, _greedy

from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.inference import SpeculativeDecoder
from acchead.inference.batched import BatchedDecoder
from acchead.inference.drafter_spec import CopySpec
from acchead.sampling import SamplingConfig

VOCAB = 12
# rows whose suffixes recur (a copy in their first round), one that does not, one of a single token
PROMPTS = [[1, 4, 2, 1, 4, 2, 7, 1, 4], [3, 5], [8, 5, 8, 3, 9, 8], [2]]
MAX_NEW = [40, 24, 32, 12]


@pytest.fixture(scope="module")
def pair():
    target = _peaked_llama(VOCAB, seed=3)
    return target, _perturbed(target, 0.5, seed=4)


@pytest.fixture(scope="module")
def feature(pair):
    return _feature_draft(pair[0])


def _head(draft) -> AcceptanceHead:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # a random head: its stops are arbitrary, which exactness must not notice
        return AcceptanceHead(draft.config.hidden_size, depth=1)


COPY = CopySpec(2, 6, batch_budget=24)  # 4 rows copy 6 each, as one prompt would: the single decoder's rounds


def _decoder(target, draft, policy: str, copy: CopySpec = COPY, **kw) -> BatchedDecoder:
    head = _head(draft) if policy.startswith("specdecpp") else None
    return BatchedDecoder(target, draft, policy, head=head, copy=copy, **kw)


def _tokens(res) -> list[list[int]]:
    return [r.new_ids.tolist() for r in res.rows]


@pytest.mark.parametrize("kind", ["model-draft", "feature-draft"])
@pytest.mark.parametrize("policy", ["specdec:k=2", "specdecpp:h=0.5,max=4"])
@pytest.mark.parametrize("verifier", ["token", "block"])
def test_greedy_rows_equal_the_targets_with_copying_and_drafting_rows_side_by_side(
    pair, feature, kind, policy, verifier
):
    target, draft = pair[0], feature if kind == "feature-draft" else pair[1]
    dec = _decoder(target, draft, policy, verifier=verifier)
    res = dec.generate(PROMPTS, max_new_tokens=MAX_NEW, temperature=0)
    for b, prompt in enumerate(PROMPTS):
        assert res.rows[b].new_ids.tolist() == _greedy(target, prompt, MAX_NEW[b]), b
    assert res.rows[0].copied_rounds > 0 and res.rows[2].copied_rounds > 0  # their first rounds copy
    assert res.copied_rounds == sum(r.copied_rounds for r in res.rows) and res.draft_calls > 0
    # some round had a copying row beside a drafting one: row 0's first round copies 6, row 1 drafts
    # (a feature draft drafts from the second round, after the target's first states)
    first = 1 if kind == "feature-draft" else 0
    assert res.rows[0].drafted_per_round[0] == 6 and res.rows[1].drafted_per_round[first] > 0


@pytest.mark.parametrize("kind", ["model-draft", "feature-draft"])
@pytest.mark.parametrize(
    ("policy", "verifier"),
    [("specdec:k=2", "token"), ("specdec:k=3", "block"), ("specdecpp:h=0.6,max=4", "token"),
     ("adaedl:lam=0.6,max=4", "token")],
)  # fmt: skip
def test_sampled_rows_are_the_single_prompt_decoders_with_copy_rounds(pair, feature, kind, policy, verifier):
    """Row b (seed 10 + b) has the tokens and rounds of `SpeculativeDecoder(copy=...)` decoding its prompt
    alone, copy rounds included: the same keys, the same one-hot laws, AdaEDL's λ moved only by drafted
    rounds (a row's λ moved by its copy rounds would change its later caps)."""
    target, draft = pair[0], feature if kind == "feature-draft" else pair[1]
    dec = _decoder(target, draft, policy, verifier=verifier)
    single = SpeculativeDecoder(target, draft, policy, head=dec._rule.head, verifier=verifier, fast=False,
                                copy=COPY)  # fmt: skip
    res = dec.generate(PROMPTS, max_new_tokens=16, temperature=0.9, top_k=8, seed=10, eos_token_id=5)
    copied = 0
    for b, prompt in enumerate(PROMPTS):
        ref = single.generate(torch.tensor(prompt), max_new_tokens=16, temperature=0.9, top_k=8, seed=10 + b,
                              eos_token_id=5)  # fmt: skip
        row = res.rows[b]
        assert row.new_ids.tolist() == ref.new_ids.tolist(), b
        assert row.accepted_per_round == ref.accepted_per_round, b
        assert row.drafted_per_round == ref.drafted_per_round, b
        assert row.copied_rounds == ref.copied_rounds
        copied += row.copied_rounds
    assert copied > 0


def test_chi_square_copying_row_under_the_batch_rule(pair):
    """Row 1 of a ragged batch, its first round a copy, the batch rule (c = 0.3) deciding the drafting rows'
    round lengths: its 3-token continuations follow the target's exact distribution."""
    target, draft = pair
    dec = _decoder(target, draft, "specdecpp:h=0.5,max=3", CopySpec(2, 4, 12), batch_stop=0.3)
    prompts, n = [[3, 5, 7, 9], [1, 4, 2, 1, 4], [2]], 250
    counts: Counter = Counter()
    copied = stops = 0
    for s in range(n):
        res = dec.generate(prompts, max_new_tokens=[5, 3, 4], temperature=1.0, seed=[7 * s, s, 3 * s + 1])
        counts[tuple(res.rows[1].new_ids.tolist())] += 1
        copied, stops = copied + res.rows[1].copied_rounds, stops + res.batch_stops
    assert copied >= n and stops > 0  # row 1 copied every decode; the rule ended rounds
    exact = _exact_sequences(target, prompts[1], 3, SamplingConfig(1.0))
    assert _chi_square_p_value(counts, exact, n) > 1e-3


@pytest.mark.parametrize("kind", ["model-draft", "feature-draft"])
def test_fast_path_rows_are_the_eager_batchs(pair, feature, kind):
    """On the fast path's static caches (uncompiled: what the compiled forwards trace), greedy and sampled:
    the eager batch's tokens and counts. Copy rounds leave the draft's cache behind by more than its
    compiled round start feeds (blocks of 8 accepted), which it catches up on first."""
    target, draft = pair[0], feature if kind == "feature-draft" else pair[1]
    eager, fast = (_decoder(target, draft, "specdec:k=2", CopySpec(2, 8, 32), fast=f, compile=False)
                   for f in (False, True))  # fmt: skip
    cache, catch_ups = fast._feed.cache, []
    feed = cache.feed
    cache.feed = lambda *a, eager=False, **kw: (catch_ups.append(eager), feed(*a, eager=eager, **kw))[1]
    for temperature, seed in ((0.0, 0), (1.0, 1), (1.0, 2)):
        args = {"max_new_tokens": MAX_NEW, "temperature": temperature, "seed": seed}
        ref, res = eager.generate(PROMPTS, **args), fast.generate(PROMPTS, **args)
        assert _tokens(res) == _tokens(ref)
        assert [r.drafted_per_round for r in res.rows] == [r.drafted_per_round for r in ref.rows]
        assert (res.target_calls, res.draft_calls, res.copied_rounds) == (
            ref.target_calls, ref.draft_calls, ref.copied_rounds)  # fmt: skip
    assert any(catch_ups)  # a row lacked more than the compiled round start feeds


@pytest.mark.parametrize("kind", ["model-draft", "feature-draft"])
def test_compiled_copy_rounds_compile_nothing_after_warm_up(pair, feature, caplog, kind):
    """Compiled as on CUDA (the `cudagraphs` backend, uncaptured on the CPU): `warm_up` compiles the widths
    a copy round verifies, the draft's catch-up past its compiled round start runs uncompiled, so nothing
    compiles during the decode; greedy rows are the target's."""
    from acchead.inference.device_path import DevicePath

    target, draft = pair[0], feature if kind == "feature-draft" else pair[1]
    path = DevicePath(True, backend="cudagraphs")
    dec = _decoder(target, draft, "specdec:k=2", device_path=path, fast=True)
    assert dec.warm_up(len(PROMPTS), max(map(len, PROMPTS)) + max(MAX_NEW)) > 0
    with caplog.at_level(logging.DEBUG, logger="acchead.inference.compiled_units"):
        res = dec.generate(PROMPTS, max_new_tokens=MAX_NEW, temperature=0)
    assert not [r.getMessage() for r in caplog.records if "ready in" in r.getMessage()]  # nothing compiled
    assert _tokens(res) == [_greedy(target, p, m) for p, m in zip(PROMPTS, MAX_NEW, strict=True)]
    assert res.copied_rounds > 0


def test_a_round_over_r_rows_copies_up_to_budget_over_r_and_one_prompt_up_to_block(pair):
    """`copy:block=6` with the default `batch=16`: a round over 4 rows copies at most 16 // 4 = 4 tokens per
    row (a copying row widens every row's verification); on the eager path rows that finish leave the
    batch and the others may copy more, on the fast path they stay (as holes) and the cap with them; a batch
    of one (the single-prompt decoder) copies up to the block, 6."""
    target, draft = pair
    assert [CopySpec(2, 6).row_block(r) for r in (1, 3, 4, 16, 64)] == [6, 5, 4, 2, 2]
    assert CopySpec(2, 1).row_block(16) == 1  # never past the block
    eager = _decoder(target, draft, "specdec:k=2", CopySpec(2, 6))
    res = eager.generate(PROMPTS, max_new_tokens=MAX_NEW, temperature=0)
    assert res.rows[0].drafted_per_round[0] == 4  # its first round, all 4 rows decoding
    fast = _decoder(target, draft, "specdec:k=2", CopySpec(2, 6), fast=True, compile=False)
    res = fast.generate(PROMPTS, max_new_tokens=MAX_NEW, temperature=0)
    assert _tokens(res) == [_greedy(target, p, m) for p, m in zip(PROMPTS, MAX_NEW, strict=True)]
    assert max(n for r in res.rows for n in r.drafted_per_round) == 4 == fast.widest(4)
    one = eager.generate(PROMPTS[:1], max_new_tokens=30, temperature=0)
    assert one.rows[0].new_ids.tolist() == _greedy(target, PROMPTS[0], 30) and one.copied_rounds > 0
    assert one.rows[0].drafted_per_round[0] == 6  # its first round copies the whole block



def test_refusals(pair):
    target, draft = pair
    with pytest.raises(AccheadError, match="pass a draft model"):
        BatchedDecoder(target, None, "autoregressive", copy=CopySpec())
    with pytest.raises(AccheadError, match="pass a draft model"):
        BatchedDecoder(target, draft, "autoregressive", copy=CopySpec())
    with pytest.raises(AccheadError, match="not both"):
        BatchedDecoder(target, draft, spec="copy+specdec:k=2", copy=CopySpec())
    with pytest.raises(AccheadError, match="gated"):
        _decoder(target, draft, "specdecpp:h=0.5,max=4", batch_stop="gated")
    assert BatchedDecoder(target, draft, spec="copy:min=2,block=8+specdec:k=2").copy == CopySpec(2, 8)


def test_decode_cli_batches_copy_rounds(tiny_pair_dirs, capsys):
    """`acchead-decode --batch-size 2 --policy copy:...+POLICY`: both rows decode, and the JSON counts the
    rows' copied rounds."""
    import json

    from acchead.inference.cli_decode import main as decode_main

    t, d = tiny_pair_dirs
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return"  # its suffix recurs
    argv = ["--target", str(t), "--draft", str(d), "--prompt", prompt, "--max-new-tokens", "12",
            "--policy", "copy:min=2+specdec:k=2", "--batch-size", "2", "--json"]  # fmt: skip
    assert decode_main(argv) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["copied_rounds"] >= 2 and len(stats["texts"]) == 2
    assert decode_main(argv[:-1]) == 0
    out = capsys.readouterr().out
    assert "--- copy:min=2+specdec:k=2, token verification" in out
    assert f"copied rounds {stats['copied_rounds']} |" in out  # greedy: the same rounds again
