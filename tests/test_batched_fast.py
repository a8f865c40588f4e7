"""The batched fast path (issue 33): `StaticRaggedCache` and `BatchedDecoder(fast=True)`.

Its CPU twin (`compile=False`: the same static caches, shared write position, holes, compaction and
growth, run eagerly) decodes exactly what the eager batched decoder decodes, which tests/test_batched.py
proves equal to each prompt decoded alone; one test compiles the forwards and checks the same.
"""

from __future__ import annotations

import pytest
import torch
from test_batched import MAX_NEW, PROMPTS, _decoder, _heads, check_ragged_cache
from test_feature_draft import trained_feature_pair
from torch._dynamo.utils import counters

from acchead.inference.batched import BatchedDecoder
from acchead.inference.device_path import DevicePath
from acchead.inference.static_ragged_cache import StaticRaggedCache, ragged_cache


@pytest.fixture(scope="module")
def peaked_pair():
    from exact_models import _peaked_llama, _perturbed

    target = _peaked_llama(12, seed=3)
    return target, _perturbed(target, 0.5, seed=4)


@torch.inference_mode()
def test_static_ragged_cache_rows_equal_the_row_alone(peaked_pair):
    """The ragged cache's check on the static twin: 30 ragged feeds and rollbacks fill its 64 slots, so
    it compacts in place (the write position moves back) and keeps every row's logits."""
    target, _ = peaked_pair
    cache = StaticRaggedCache(target, compile=False, capacity=1)
    assert cache.capacity == 64
    check_ragged_cache(cache, target)


@torch.inference_mode()
def test_static_ragged_cache_grows_and_keeps_rows(peaked_pair):
    """A row longer than the cache grows it (a new cache holding the old slots); batch sizes keep caches
    of their own; a finished row is an all-hole row of the same physical batch."""
    target, _ = peaked_pair
    cache = StaticRaggedCache(target, compile=False, capacity=1)
    cache.reset(2)
    first = cache.cache
    long = torch.randint(1, 12, (2, 60), generator=torch.Generator().manual_seed(1))
    cache.feed(long, torch.tensor([60, 30]), keep=1)
    logits, _ = cache.feed(long[:, :10], torch.tensor([10, 10]), keep=1)  # 70 slots: grows to 128
    assert cache.capacity == 128 and cache.cache is not first
    for b, n in enumerate((60, 30)):
        ref = target(input_ids=torch.cat([long[b, 60 - n :], long[b, :10]])[None]).logits[0, -1]
        assert torch.allclose(logits[b, -1], ref, atol=1e-5)
    cache.select(torch.tensor([1]))  # row 0 finished: the batch stays 2 rows, row 0 all holes
    assert cache.length.tolist() == [40] and cache.batch == 2 and not cache._mask[0].any()
    logits, _ = cache.feed(long[1:, :1], torch.tensor([1]), keep=1)
    ref = target(input_ids=torch.cat([long[1, 30:], long[1, :10], long[1, :1]])[None]).logits[0, -1]
    assert logits.shape[0] == 1 and torch.allclose(logits[0, -1], ref, atol=1e-5)
    cache.reset(3)
    assert cache.batch == 3 and cache.cache is not first
    cache.reset(2)  # back to B = 2: the cache it had
    assert cache.capacity == 128 and cache.used == 0


FAST_CASES = [
    ("autoregressive", None, False),
    ("specdec:k=1", None, False),
    ("specdec:k=4", None, False),
    ("specdecpp:h=0.5,max=6", "candidate", True),
    ("specdecpp:h=0.6,max=6", "lookahead", False),
    ("adaedl:lam=0.6,max=6", None, False),
]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize(("spec", "kind", "batch_stop"), FAST_CASES, ids=lambda x: str(x))
def test_fast_rows_equal_the_eager_batch(peaked_pair, spec, kind, batch_stop, temperature):
    """Greedy and sampled, ragged prompts, rows ending at EOS or their own max tokens: the fast path's
    rows are the eager path's, token for token (same keys per row), and so are the counts."""
    for verifier in ("token", "block"):
        kw = {"verifier": verifier, "batch_stop": batch_stop}
        eager = _decoder(peaked_pair, spec, kind, **kw)
        fast = _decoder(peaked_pair, spec, kind, fast=True, compile=False, **kw)
        assert fast.fast and not eager.fast
        for eos in (None, 5):
            args = {"max_new_tokens": MAX_NEW, "temperature": temperature, "eos_token_id": eos, "seed": 7}
            ref, res = eager.generate(PROMPTS, **args), fast.generate(PROMPTS, **args)
            assert [r.new_ids.tolist() for r in res.rows] == [r.new_ids.tolist() for r in ref.rows]
            assert (res.target_calls, res.draft_calls) == (ref.target_calls, ref.draft_calls)


@pytest.mark.parametrize("compile", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_fast_feature_draft_rows_equal_the_eager_batch(tmp_path_factory, compile):
    """A feature (EAGLE) draft on the fast path: its pairs' states travel through the static caches too
    (compiled: the draft's forwards over (token, state) pairs are graphs as well)."""
    target, draft = trained_feature_pair(tmp_path_factory)
    head = _heads(draft.config.hidden_size)["lookahead"]
    prompts = [[5, 9, 2, 7], [3], [8, 1, 4]]
    for spec in ("specdec:k=3", "specdecpp:h=0.5,max=5"):
        hd = head if spec.startswith("specdecpp") else None
        eager = BatchedDecoder(target, draft, spec, head=hd)
        fast = BatchedDecoder(target, draft, spec, head=hd, fast=True, compile=compile)
        fast.warm_up(len(prompts), 16)
        for temperature in (0.0, 1.0):
            ref = eager.generate(prompts, max_new_tokens=12, temperature=temperature, seed=3)
            res = fast.generate(prompts, max_new_tokens=12, temperature=temperature, seed=3)
            assert [r.new_ids.tolist() for r in res.rows] == [r.new_ids.tolist() for r in ref.rows], spec


@pytest.mark.parametrize(
    ("spec", "kind", "device_path"),
    [
        # compiled as on CUDA (graph-replay options, outputs copied out): ~8 s, the default suite's
        ("specdec:k=2", None, True),
        # the draft step's head, thresholds and batch rule traced into the draft's graphs (~40 s)
        pytest.param("specdecpp:h=0.6,max=4", "lookahead", True, marks=pytest.mark.slow),
        # the CPU's own compile (weights frozen, C++ wrapper): ~37 s on the 2-core box
        pytest.param("specdec:k=1", None, None, marks=pytest.mark.slow),
        pytest.param("specdec:k=4", None, None, marks=pytest.mark.slow),  # width 5: padded to 6
        pytest.param("specdecpp:h=0.5,max=6", "candidate", None, marks=pytest.mark.slow),
        # the `cudagraphs` backend: the ladder's static widths (5 tokens padded to 6), no symbolic graph
        pytest.param("specdec:k=4", None, DevicePath(True, "cudagraphs"), id="specdec:k=4-cudagraphs"),
    ],
)
def test_compiled_fast_rows_equal_the_eager_batch(peaked_pair, spec, kind, device_path):
    """Compiled forwards (one graph per (B, width): on the CPU the padded widths' static graphs, on the
    device path one symbolic graph from 5 tokens, with the `cudagraphs` backend the static ones; the graphs
    shared by every batched decoder of the model and path; SpecDec++'s step in the draft's graphs): after
    `warm_up`, nothing compiles, greedy rows and counts equal the eager batch's, a second threshold reuses
    the graphs, and an autoregressive decoder of the same target reuses the compiled cache."""
    target, draft = peaked_pair
    batch_stop = kind is not None  # the batch rule too: its c(B)·B is a graph input
    fast = _decoder(peaked_pair, spec, kind, batch_stop=batch_stop, fast=True, device_path=device_path)
    shared = ragged_cache(target, True, device_path), ragged_cache(draft, True, device_path)
    assert (fast.t_cache, fast._feed.cache) == shared and fast.t_cache.path.on == bool(device_path)
    assert fast.warm_up(4, 40) > 0
    ref = _decoder(peaked_pair, spec, kind, batch_stop=batch_stop).generate(PROMPTS, MAX_NEW, temperature=0)
    graphs = counters["stats"]["unique_graphs"]
    res = fast.generate(PROMPTS, MAX_NEW, temperature=0)
    assert counters["stats"]["unique_graphs"] == graphs  # warm_up compiled every width the decode fed
    assert [r.new_ids.tolist() for r in res.rows] == [r.new_ids.tolist() for r in ref.rows]
    counts = ("target_calls", "draft_calls", "head_calls", "batch_stops")
    assert [getattr(res, c) for c in counts] == [getattr(ref, c) for c in counts]
    if kind is not None:  # another threshold, no batch rule: the same graphs (both are graph inputs)
        graphs = counters["stats"]["unique_graphs"]
        other = _decoder(peaked_pair, spec.replace("h=0.", "h=0.1"), kind, fast=True, device_path=device_path)
        other._rule = fast._rule  # the same head object (another one would be another graph constant)
        other.warm_up(4, 40)
        other.generate(PROMPTS, MAX_NEW, temperature=0)
        assert counters["stats"]["unique_graphs"] == graphs
    other = BatchedDecoder(target, None, "autoregressive", fast=True, device_path=device_path)
    assert other.t_cache is fast.t_cache
    out = other.generate(PROMPTS, MAX_NEW, temperature=0)
    assert [r.new_ids.tolist() for r in out.rows] == [r.new_ids.tolist() for r in ref.rows]


@pytest.mark.slow
def test_two_heads_on_one_draft_each_run_their_own(peaked_pair):
    """Two SpecDec++ decoders of one draft with different heads, both warmed up before either decodes (the
    bench's order), each decode as its eager twin: their step graphs live in compiled functions of their own
    (~80 s; forty-first session: with one, both ran the head compiled last, since a seen key skips the
    guards that would tell them apart)."""
    spec = "specdecpp:h=0.6,max=4"
    kinds = ("lookahead", "candidate")
    fast = {k: _decoder(peaked_pair, spec, k, batch_stop=True, fast=True) for k in kinds}
    for dec in fast.values():
        dec.warm_up(4, 40)
    counts = ("target_calls", "draft_calls", "head_calls", "batch_stops")
    for k in kinds:
        ref = _decoder(peaked_pair, spec, k, batch_stop=True).generate(PROMPTS, MAX_NEW, temperature=0)
        res = fast[k].generate(PROMPTS, MAX_NEW, temperature=0)
        assert [getattr(res, c) for c in counts] == [getattr(ref, c) for c in counts], k


def test_fast_measured_batch_rule_warms_up_before_its_costs(peaked_pair):
    """`warm_up` runs before the measured rule has timed its c(B) (the bench's order: `generate` times it
    first); greedy rows still equal autoregressive decoding's."""
    fast = _decoder(peaked_pair, "specdecpp:h=0.6,max=4", "lookahead", batch_stop="measured", fast=True,
                    compile=False)  # fmt: skip
    assert fast.batch_stop.costs is None
    assert fast.warm_up(len(PROMPTS), 40) > 0
    res = fast.generate(PROMPTS, MAX_NEW, temperature=0)
    ref = _decoder(peaked_pair, "autoregressive", None).generate(PROMPTS, MAX_NEW, temperature=0)
    assert fast.batch_stop.costs is not None
    assert [r.new_ids.tolist() for r in res.rows] == [r.new_ids.tolist() for r in ref.rows]
