"""A feature (EAGLE) draft on the fast path: the target's padded verification units also return the states
of the positions they fed (`RoundVerifier`, `states=True`; `StaticRunner.feed`'s `all_hidden`), and the
feature drafter, on its own static cache, reads the accepted ones (a round's first forward at a ladder
width). Greedy tokens are the target's greedy decoding; sampled ones the eager path's (the same
counter-keyed draws), so the chi-square suites of the eager feature drafter (tests/test_feature_draft.py)
carry over."""

from __future__ import annotations

import pytest
import torch
from test_feature_draft import trained_feature_pair

from acchead.head import AcceptanceHead
from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.device_path import DevicePath
from acchead.inference.feature_drafter import FeatureDrafter
from acchead.inference.model_runner import StaticRunner

PROMPT = torch.tensor([1, 4, 7])
SPECS = ["specdec:k=3", "specdecpp:h=0.5,max=6"]


@pytest.fixture(scope="module")
def feature_pair(tmp_path_factory):
    return trained_feature_pair(tmp_path_factory)


def _decoder(target, draft, spec: str, **kwargs) -> SpeculativeDecoder:
    torch.manual_seed(0)  # the same head for every path
    head = AcceptanceHead(32, depth=1) if spec.startswith("specdecpp") else None
    return SpeculativeDecoder(target, draft, policy=spec, head=head, **kwargs)


@pytest.mark.parametrize("spec", SPECS)
def test_fast_path_tokens_are_the_eager_paths(feature_pair, spec):
    """The static caches uncompiled (the same unit functions the compiled path traces): greedy tokens equal
    the target's greedy decoding, sampled tokens and round lengths equal the eager feature decoder's."""
    target, draft = feature_pair
    fast = _decoder(target, draft, spec, fast=True, compile=False)
    eager = _decoder(target, draft, spec, fast=False)
    assert isinstance(fast._runner, StaticRunner) and isinstance(fast.drafter, FeatureDrafter)
    ref = target.generate(PROMPT[None], max_new_tokens=24, do_sample=False, pad_token_id=0)[0, 3:].tolist()
    got = fast.generate(PROMPT, max_new_tokens=24, temperature=0)
    assert got.new_ids.tolist() == ref and sum(got.accepted_per_round) > 0
    for seed in range(3):
        a = fast.generate(PROMPT, max_new_tokens=16, temperature=1.0, seed=seed)
        b = eager.generate(PROMPT, max_new_tokens=16, temperature=1.0, seed=seed)
        assert a.new_ids.tolist() == b.new_ids.tolist()
        assert a.drafted_per_round == b.drafted_per_round


def test_round_start_feeds_a_ladder_width_with_the_eager_draws(feature_pair):
    """A fast drafter's round whose start lacks 5 pairs feeds 6 (the ladder's next width), re-feeding one
    cached pair on the target's states: the same candidate and q as the eager drafter's exact feed."""
    from acchead.sampling import SamplingConfig

    _, draft = feature_pair
    torch.manual_seed(0)
    ctx = torch.tensor([1, 4, 7, 2, 5, 3, 6, 8])  # 8 committed tokens: the second round starts at n0 = 8
    states = torch.randn(7, draft.state_width)  # the target's states of positions 0..6
    fast, eager = FeatureDrafter(draft, fast=True, compile=False), FeatureDrafter(draft)
    fed = []
    feed = fast.runner.feed
    fast.runner.feed = lambda tokens, *a, **k: fed.append(tokens.numel()) or feed(tokens, *a, **k)
    steps = []
    for d in (fast, eager):
        with torch.inference_mode():  # as the decoder drives it
            d.begin(ctx[:3], SamplingConfig(temperature=0.0), 0)
            d.observe(states[:2], 0)
            d.propose(ctx[:3], 1, want_hidden=False)  # the first round: pairs 0..1
            d.rollback(3)
            d.observe(states[2:], 2)  # five positions accepted since
            steps.append(d.propose(ctx, 1, want_hidden=False, want_state=True))
    assert fed == [2, 6] and fast.runner.length == 7
    assert steps[0].token == steps[1].token
    torch.testing.assert_close(steps[0].q, steps[1].q)
    torch.testing.assert_close(steps[0].state, steps[1].state)


@pytest.mark.parametrize("cap", [4, 20])
def test_warm_up_feeds_every_round_start_width(feature_pair, cap):
    """`warm_up` prepares the round-start unit of every width a round can need (1..cap + 1 pairs lacking,
    each at its ladder width: cap 4 needs 6)."""
    from acchead.inference.policy_build import parse_policy
    from acchead.inference.round_verifier import verify_width
    from acchead.sampling import SamplingConfig

    _, draft = feature_pair
    drafter = FeatureDrafter(draft, fast=True, compile=False)
    fed = []
    feed = drafter.runner.feed
    drafter.runner.feed = lambda tokens, *a, **k: fed.append(tokens.numel()) or feed(tokens, *a, **k)
    torch.manual_seed(0)
    policy = parse_policy(f"specdecpp:h=0.5,max={cap}", head=AcceptanceHead(32, depth=1))
    with torch.inference_mode():
        drafter.warm_up(64, SamplingConfig(0.0), policy.start_decode())
    assert set(fed[1:]) >= {verify_width(c) for c in range(1, cap + 2)}  # fed[0]: the eager prefill


def test_fast_drafter_judges_in_its_units(feature_pair):
    """On the fast path the drafter runs on a static cache and SpecDec++'s rule runs inside its units: every
    judged candidate comes back with its flag, and the tokens are the eager path's."""
    target, draft = feature_pair
    dec = _decoder(target, draft, "specdecpp:h=0.5,max=6", fast=True, compile=False)
    assert isinstance(dec.drafter.runner, StaticRunner)
    flags, propose = [], dec.drafter.propose

    def spy_propose(*args, judge=None, **kwargs):
        step = propose(*args, judge=judge, **kwargs)
        flags.append((judge is not None, step.stop is not None))
        return step

    dec.drafter.propose = spy_propose
    got = dec.generate(PROMPT, max_new_tokens=24, temperature=1.0, seed=1)
    eager = _decoder(target, draft, "specdecpp:h=0.5,max=6", fast=False)
    ref = eager.generate(PROMPT, max_new_tokens=24, temperature=1.0, seed=1)
    assert got.new_ids.tolist() == ref.new_ids.tolist()
    assert any(j for j, _ in flags) and all(s == j for j, s in flags)


@pytest.mark.parametrize("spec", SPECS)
def test_compiled_verification_hands_the_states_over(feature_pair, spec):
    """Compiled (the device path's units through the `cudagraphs` backend, uncaptured on the CPU: seconds of
    tracing): `warm_up` prepares the verification units that return states, nothing compiles during the
    decode, and the greedy tokens are the target's."""
    target, draft = feature_pair
    dec = _decoder(target, draft, spec, fast=True, device_path=DevicePath(True, backend="cudagraphs"))
    dec.warm_up(PROMPT.numel() + 24)
    with torch.compiler.set_stance("fail_on_recompile"):
        got = dec.generate(PROMPT, max_new_tokens=24, temperature=0)
    ref = target.generate(PROMPT[None], max_new_tokens=24, do_sample=False, pad_token_id=0)[0, 3:].tolist()
    assert got.new_ids.tolist() == ref and sum(got.accepted_per_round) > 0


@pytest.mark.slow
def test_cpu_fast_path_compiled_with_inductor(tiny_tokenizer):
    """The CPU's own fast path (Inductor, weights frozen) with a feature draft: greedy = the target's."""
    from test_feature_draft import _feature_draft, _peaked_llama

    target = _peaked_llama(len(tiny_tokenizer), seed=3)
    draft = _feature_draft(target).eval()
    dec = _decoder(target, draft, "specdecpp:h=0.5,max=4", fast=True)
    dec.warm_up(PROMPT.numel() + 16)
    with torch.compiler.set_stance("fail_on_recompile"):
        got = dec.generate(PROMPT, max_new_tokens=16, temperature=0)
    ref = target.generate(PROMPT[None], max_new_tokens=16, do_sample=False, pad_token_id=0)[0, 3:].tolist()
    assert got.new_ids.tolist() == ref


@pytest.mark.slow
def test_bench_runs_a_feature_draft_on_the_fast_path(tiny_pair_dirs, tiny_tokenizer, tmp_path):
    """The bench's fast path with a feature draft (about two minutes of Inductor on 2 CPU cores): its rows
    are decoded, each greedy output equal to autoregressive decoding's."""
    import json

    from test_feature_draft_pipeline import _saved_feature_draft

    from acchead.inference.bench.run import main as bench_main

    target_dir, _ = tiny_pair_dirs
    _saved_feature_draft(target_dir, tiny_tokenizer, tmp_path / "draft")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):\n    return"}) + "\n")
    argv = ["--prompts", str(prompts), "--target", str(target_dir), "--draft", str(tmp_path / "draft"),
            "--out", str(tmp_path / "bench"), "--max-new-tokens", "8", "--num-prompts", "0",
            "--k-grid", "3", "--methods", "autoregressive,specdec", "--paths", "eager,fast",
            "--overhead-calls", "3"]  # fmt: skip
    assert bench_main(argv) == 0
    res = json.loads((tmp_path / "bench" / "results.json").read_text())
    rows = {r["method"]: r for r in res["rows"]}
    assert {"autoregressive@fast", "specdec@fast"} <= set(rows) and "fast" in res["speed_by_path"]
    assert rows["specdec@fast"]["matches_autoregressive"] == 1.0
