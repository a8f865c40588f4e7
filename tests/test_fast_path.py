"""The fast path (static KV caches, compiled forwards) against the eager one, on the CPU.

Exactness of the fast path under sampling and greedy identity for every policy run in
tests/test_exactness.py (static caches without compilation); here: the cache logic itself (rollback by
position, growth), and compiled forwards giving the eager path's tokens, with no compilation left after
`warm_up`. The same on CUDA is in tests/test_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.model_runner import EagerRunner, StaticRunner


@torch.inference_mode()
@pytest.mark.parametrize("crop", ["transformers", "ours"])
def test_static_cache_rolls_back_and_grows_like_the_dynamic_one(tiny_llama_pair, monkeypatch, crop):
    """Same logits as the eager `DynamicCache` through prefill, decode steps, multi-token feeds,
    rollbacks into the middle of what was fed, and growth past the preallocated capacity (128); with the
    release's own `StaticLayer.crop` and with ours, which releases without one (5.17) get."""
    from transformers.cache_utils import StaticLayer

    from acchead.inference.static_runner import RollbackStaticLayer

    if crop == "ours" and hasattr(StaticLayer, "crop"):
        monkeypatch.delattr(StaticLayer, "crop")
    elif crop == "transformers" and not hasattr(StaticLayer, "crop"):
        pytest.skip("this transformers release's StaticLayer has no crop")
    target, _ = tiny_llama_pair
    target.config.max_position_embeddings = 1024  # room to grow (rotary positions have no table)
    eager, static = EagerRunner(target), StaticRunner(target, capacity=16, compile=False)
    assert static.capacity == 128
    g = torch.Generator().manual_seed(0)
    for runner in (eager, static):
        runner.reset(8)
    prompt = torch.randint(1, 300, (7,), generator=g)
    a, b = eager.feed(prompt, keep=2, want_hidden=True), static.feed(prompt, keep=2, want_hidden=True)
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[1], b[1])
    length = 7
    while length < 300:  # past the capacity: the static cache is reallocated and its content copied
        n = int(torch.randint(1, 5, (1,), generator=g))
        tokens = torch.randint(1, 300, (n,), generator=g)
        (la, _), (lb, _) = eager.feed(tokens, keep=n), static.feed(tokens, keep=n)
        torch.testing.assert_close(la, lb, rtol=1e-4, atol=1e-4)
        keep = length + int(torch.randint(0, n + 1, (1,), generator=g))  # reject a random suffix
        eager.rollback(keep)
        static.rollback(keep)
        assert eager.length == static.length == keep
        length = keep
    assert static.capacity == 384
    assert all(isinstance(layer, RollbackStaticLayer) == (crop == "ours") for layer in static.cache.layers)


def test_fast_path_refuses_a_context_overflow(tiny_llama_pair):
    target, _ = tiny_llama_pair
    static = StaticRunner(target, compile=False)
    limit = target.config.max_position_embeddings
    static.reset(limit)
    with pytest.raises(AccheadError, match="exceeds the model's context"):
        static.reset(limit + 1)


def _greedy(dec: SpeculativeDecoder, prompt: torch.Tensor, n: int = 24) -> list[int]:
    return dec.generate(prompt, max_new_tokens=n, temperature=0).new_ids.tolist()


def test_compiled_fast_path_equals_eager_and_decoders_of_one_model_take_turns(compiled_pair):
    """torch.compile on the CPU (Inductor, frozen weights, C++ wrapper), one test because compiling is
    the slow part: greedy tokens equal eager decoding's for several policies (a head policy reads the
    draft's hidden state) whose decoders share each model's runner and take turns, with different prompts
    and lengths; after `warm_up` nothing compiles (dynamo is told to fail on any recompilation).

    A compiled graph is bound to the cache it was captured with (frozen on the CPU, recorded addresses on
    CUDA): a second compiled cache of the same model once replayed the first one's graph into the first
    one's cache, giving wrong tokens silently. Hence one runner per model, checked here.

    The models are the session's `compiled_pair`, shared with tests/test_bench.py: a forward shape either
    test compiled is reused by the other (warm_up then compiles only the shapes still missing)."""
    target, draft = compiled_pair
    head = AcceptanceHead(draft.config.hidden_size, depth=1)
    specs = ["autoregressive", "specdec:k=2", "specdecpp:h=0.5,max=3"]
    fast = [SpeculativeDecoder(target, draft, policy=s, head=head, fast=True) for s in specs]
    eager = [SpeculativeDecoder(target, draft, policy=s, head=head, fast=False) for s in specs]
    assert all(f.fast for f in fast) and not any(e.fast for e in eager)
    assert fast[0]._runner is fast[1]._runner is fast[2]._runner
    assert fast[1].drafter.runner is fast[2].drafter.runner
    for dec in fast:
        dec.warm_up(64)
    # S is part of each unit: each S is warmed up. One sampled unit here (autoregressive's, whose draw is
    # the eager one under the same seed); every rule's sampled units: the slow test below.
    fast[0].warm_up(64, temperature=1.0)
    with torch.compiler.set_stance("fail_on_recompile"):
        for prompt, n in ((torch.tensor([5, 9, 17, 33, 2]), 24), (torch.tensor([7, 1, 4]), 40)):
            for f, e in zip(fast, eager, strict=True):
                assert _greedy(f, prompt, n) == _greedy(e, prompt, n)
        res = fast[0].generate(prompt, max_new_tokens=24, temperature=1.0, seed=3)
    assert res.new_ids.tolist() == eager[0].generate(prompt, 24, temperature=1.0, seed=3).new_ids.tolist()
    with pytest.raises(AccheadError, match="distinct target and draft"):
        SpeculativeDecoder(target, target, policy="specdec:k=2", fast=True)


def _rounds(dec: SpeculativeDecoder, prompt: torch.Tensor, **kw) -> tuple[list[int], list[int], int]:
    res = dec.generate(prompt, max_new_tokens=24, **kw)
    return res.new_ids.tolist(), res.drafted_per_round, res.head_calls


def _same_as_eager(target, draft, cases, temperatures) -> list[list[int]]:
    """Each (spec, head) case compiled and eager: the same tokens, round lengths and head calls under each
    temperature (after `warm_up`, nothing compiles). Returns the greedy round lengths per case."""
    prompt = torch.tensor([5, 9, 17, 33, 2])
    lengths = []
    for spec, head in cases:
        fast = SpeculativeDecoder(target, draft, policy=spec, head=head, fast=True)
        eager = SpeculativeDecoder(target, draft, policy=spec, head=head, fast=False)
        for t in temperatures:
            fast.warm_up(64, temperature=t)
        for t in temperatures:
            with torch.compiler.set_stance("fail_on_recompile"):
                got = _rounds(fast, prompt, temperature=t, seed=7)
            assert got == _rounds(eager, prompt, temperature=t, seed=7), (spec, t)
            if t == 0:
                lengths.append(got[1])
    return lengths


def _token_heads(hidden: int, inputs_list) -> list[AcceptanceHead]:
    torch.manual_seed(0)
    heads = [AcceptanceHead(hidden, depth=1, kind="lookahead", inputs=inputs) for inputs in inputs_list]
    for head in heads:  # a bias that makes stops common, so the rounds differ between heads
        torch.nn.init.constant_(head.out.bias, 1.0)
    return heads


def test_compiled_units_make_the_eager_stop_decisions(compiled_pair):
    """The draft's unit (forward, S, the draw, the stop rule: here a lookahead head reading the state and the
    candidate's token row) and the verification's unit compiled: the same tokens, the same round lengths (so
    the same stop decisions) and head calls as the eager path. Two heads of one shape but different weights
    each match their own eager decoder, and share one compiled step: a head's weights (and its threshold)
    are inputs of the compiled step, not constants frozen into it (a frozen head would make the second
    decoder replay the first's rule)."""
    target, draft = compiled_pair
    heads = _token_heads(draft.config.hidden_size, [("state", "token")] * 2)
    cases = [("specdecpp:h=0.5,max=3", heads[0]), ("specdecpp:h=0.6,max=3", heads[1])]
    lengths = _same_as_eager(target, draft, cases, temperatures=(0.0,))
    assert lengths[0] != lengths[1], "the two heads should stop differently (else the test proves nothing)"


@pytest.mark.slow
def test_compiled_units_make_the_eager_decisions_and_draws_for_every_rule(compiled_pair):
    """As above, for every rule judged inside the draft's unit (lookahead heads with log q and entropy
    inputs, one reading the draft's statistics alone, confidence, AdaEDL with its λ as an input) and under
    sampling: the counter-keyed draws inside the compiled units are the eager ones."""
    target, draft = compiled_pair
    head, stats_head = _token_heads(
        draft.config.hidden_size, [("state", "logq", "entropy"), ("logq", "entropy", "topk")]
    )
    cases = [("specdecpp:h=0.5,max=3", head), ("specdecpp:h=0.6,max=3", stats_head)]
    cases.append(("confidence:tau=0.9,max=3", None))
    cases.append(("adaedl:lam=0.9,max=3", None))
    _same_as_eager(target, draft, cases, temperatures=(0.0, 1.0))


@pytest.mark.slow
def test_compiled_fixed_k_round_unit_equals_eager(compiled_pair):
    """A fixed-K round as one compiled unit (the CUDA default, opt-in on the CPU) decodes the eager path's
    tokens in the same rounds, greedy and at T = 1; nothing compiles after `warm_up`."""
    from acchead.inference.drafters import ModelDrafter

    target, draft = compiled_pair
    prompt = torch.tensor([5, 9, 17, 33, 2])
    drafter = ModelDrafter(draft, fast=True, round_unit=True)
    fast = SpeculativeDecoder(target, drafter, policy="specdec:k=3", fast=True)
    eager = SpeculativeDecoder(target, draft, policy="specdec:k=3", fast=False)
    assert fast.fast
    for t in (0.0, 1.0):
        fast.warm_up(64, temperature=t)
    with torch.compiler.set_stance("fail_on_recompile"):
        got = [_rounds(fast, prompt, temperature=t, seed=5) for t in (0.0, 1.0)]
    assert got == [_rounds(eager, prompt, temperature=t, seed=5) for t in (0.0, 1.0)]


def _new_thresholds_replay(target, draft, warmed: str, specs: list[str], head=None) -> list[list[int]]:
    """Warm up `warmed`, then decode each of `specs` (the same rule, other thresholds) with no warm-up of its
    own under `fail_on_recompile`: a threshold that were a constant of the compiled step would recompile
    and fail. Each decodes the eager path's tokens and rounds; returns the greedy round lengths per spec."""
    prompt = torch.tensor([5, 9, 17, 33, 2])
    SpeculativeDecoder(target, draft, policy=warmed, head=head, fast=True).warm_up(64)
    lengths = []
    for spec in specs:
        fast = SpeculativeDecoder(target, draft, policy=spec, head=head, fast=True)
        with torch.compiler.set_stance("fail_on_recompile"):
            got = _rounds(fast, prompt, temperature=0)
        eager = SpeculativeDecoder(target, draft, policy=spec, head=head, fast=False)
        assert got == _rounds(eager, prompt, temperature=0), spec
        lengths.append(got[1])
    return lengths


def test_a_new_specdecpp_threshold_compiles_nothing(compiled_pair):
    """SpecDec++'s h is an input of the draft's compiled step: one graph serves every threshold of a sweep
    (issue 32). The head and shapes are those of the test above, so its graphs are reused when it ran
    first."""
    target, draft = compiled_pair
    (head,) = _token_heads(draft.config.hidden_size, [("state", "token")])
    specs = ["specdecpp:h=0.2,max=3", "specdecpp:h=0.8,max=3"]
    lengths = _new_thresholds_replay(target, draft, "specdecpp:h=0.5,max=3", specs, head)
    assert lengths[0] != lengths[1], "the thresholds should stop differently (else the test proves nothing)"


def test_every_k_reuses_the_verifications_of_specdecpp(compiled_pair):
    """The candidate count is an input of the target's verification unit, not a constant of it: after
    SpecDec++ (cap 6) warmed up, autoregressive decoding and every fixed K up to the cap decode the eager
    tokens compiling nothing (issue 32: a graph per K + 1 before). Each round is padded to its width
    (`acchead.inference.round_verifier.VERIFY_WIDTHS`: K = 4 and 5 run width 6, K = 6 width 8)."""
    target, draft = compiled_pair
    (head,) = _token_heads(draft.config.hidden_size, [("state", "token")])
    specs = ["autoregressive", *(f"specdec:k={k}" for k in range(1, 7))]
    _new_thresholds_replay(target, draft, "specdecpp:h=0.5,max=6", specs, head)


@pytest.mark.slow
def test_new_confidence_and_entropy_thresholds_compile_nothing(compiled_pair):
    """The confidence and entropy rules' tau are inputs of the compiled step too (they were constants: a
    new tau recompiled, about 30 s each on the CPU). The random draft's softmax is nearly uniform over 320
    tokens (H ≈ 5.8 nats), so tau 0.9 / 0.5 stop after every candidate and tau 0 / 10 never do."""
    target, draft = compiled_pair
    for rule, taus in (("confidence", (0.5, 0.9, 0.0)), ("entropy", (1.5, 0.5, 10.0))):
        specs = [f"{rule}:tau={t},max=3" for t in taus]
        lengths = _new_thresholds_replay(target, draft, specs[0], specs[1:])
        assert lengths[0] != lengths[1], rule


_CACHE_PROBE = """
import sys, torch
from torch._dynamo.utils import counters
sys.path.insert(0, {tests!r})
from conftest import make_tiny_llama
from acchead.inference.decoder import SpeculativeDecoder

ids = torch.tensor([[5, 6, 7, 8]])
out = []
for seed in (1, 1, 2):  # a second object of the same weights, then other weights of the same shape
    torch._dynamo.reset()  # forget the process's compiled code: only Inductor's cache is left
    model = make_tiny_llama(64, hidden_size=16, num_layers=1, seed=seed)
    fast = SpeculativeDecoder(model, None, policy="autoregressive", fast=True)
    fast.warm_up(16)
    tokens = fast.generate(ids, max_new_tokens=6, temperature=0.0).tokens
    eager = SpeculativeDecoder(model, None, policy="autoregressive")
    out.append(tokens == eager.generate(ids, max_new_tokens=6, temperature=0.0).tokens)
print(out, dict(counters["inductor"]))
"""


def test_a_compiled_unit_is_loaded_from_inductors_cache_by_a_later_compile(tmp_path):
    """With the store of compiled units off (or for a unit it cannot hold), the CPU fast path's graphs go
    through Inductor's on-disk FX graph cache (MKL-prepacked weights cannot be pickled, so with them every
    process compiled everything again): after dynamo forgets a unit, the same unit of a new model object
    is a cache hit, and a cached graph run with other weights of the same shape still gives that model's
    own eager tokens (the weights are inputs, not in the cache)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "ACCHEAD_UNIT_STORE": "0"}
    code = _CACHE_PROBE.format(tests=str(Path(__file__).parent))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("[True, True, True]"), line
    assert "'fxgraph_cache_bypass'" not in line, line
    assert "'fxgraph_cache_hit': 2" in line, line
