"""The CUDA default's branches, run on the CPU through `device_path=True` (`acchead.inference.device_path`).

No GPU is lent to most runs, so each branch a CUDA user takes by default has a CPU twin here: the fast path
and the fixed-K round unit chosen by default, units compiled for graph replay (weights not frozen) with their
outputs copied out, the prompt's non-blocking upload, phase timing by events, and `host_reads.read` under
CUDA's sync debug mode. Each test checks that the branch ran (a spy or the object it made), not only that
the tokens are right; the tokens are checked against eager autoregressive decoding (greedy) and the
target's exact distribution (chi-square). docs/testing.md lists the branches and these tests.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from conftest import make_tiny_llama
from exact_models import _chi_square_p_value, _exact_sequences, _peaked_llama, _perturbed

import acchead.inference.device_path as device_path
import acchead.inference.host_reads as host_reads
import acchead.inference.static_runner as static_runner
from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.device_path import DevicePath, HostEvent, PhaseClock
from acchead.inference.drafters import DraftStep, ModelDrafter
from acchead.inference.model_runner import EagerRunner, StaticRunner, make_runner
from acchead.inference.round_verifier import SYMBOLIC_FROM, RoundVerifier, verify_width
from acchead.inference.verification import verify_token
from acchead.sampling import SamplingConfig

PROMPT = torch.tensor([5, 9, 17, 33, 2])


def _ar_greedy(target, prompt: torch.Tensor, n: int) -> list[int]:
    """The reference: eager autoregressive greedy decoding (itself checked against transformers' generate
    in tests/test_exactness.py)."""
    ar = SpeculativeDecoder(target, None, policy="autoregressive", fast=False)
    return ar.generate(prompt, max_new_tokens=n, temperature=0).new_ids.tolist()


def test_device_path_defaults_to_cuda_and_is_forced_by_the_flag():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")  # a device object needs no CUDA
    assert DevicePath.resolve(cuda, None).on and not DevicePath.resolve(cpu, None).on
    assert DevicePath.resolve(cpu, True).on and not DevicePath.resolve(cuda, False).on
    flags = [
        (p.compile_options, p.copy_outputs, p.fast_default, p.round_unit_default)
        for p in map(DevicePath, (True, False))
    ]
    device_options = {"options": {"triton.cudagraphs": True, "split_reductions": False}}
    assert flags == [(device_options, True, True, True), ({}, False, False, False)]
    graphs = DevicePath(True, backend="cudagraphs")
    assert graphs.compile_options == {"backend": "cudagraphs"} and DevicePath.resolve(cpu, graphs) is graphs
    # symbolic token counts: Inductor's device path only (the cudagraphs backend replays one size)
    assert [p.symbolic_shapes for p in (DevicePath(True), DevicePath(False), graphs)] == [True, False, False]
    with pytest.raises(ValueError, match="pass on=True"):
        DevicePath(False, backend="cudagraphs")
    with pytest.raises(ValueError, match="unknown compile backend"):
        DevicePath(True, backend="tvm")


def test_decoders_take_the_device_defaults(tiny_llama_pair):
    """Without `fast` / `round_unit`, a decoder on the device path runs the fast path with the fixed-K round
    unit (the CUDA default); off it, on the CPU, eager with K step units."""
    target, draft = tiny_llama_pair
    on = SpeculativeDecoder(target, draft, policy="specdec:k=3", compile=False, device_path=True)
    off = SpeculativeDecoder(target, draft, policy="specdec:k=3")
    assert on.fast and on.drafter.round_unit and isinstance(on._runner, StaticRunner)
    assert on._runner.path.on and on.drafter.runner.path.on
    assert not off.fast and not off.drafter.round_unit and isinstance(off._runner, EagerRunner)


@pytest.mark.parametrize("spec", ["autoregressive", "specdec:k=3", "specdecpp:h=0.5,max=4"])
def test_device_path_decodes_the_autoregressive_greedy_tokens(tiny_llama_pair, monkeypatch, spec):
    """The device path on the static caches (uncompiled: the compiled units are checked below): the prompt
    goes through `upload` (non-blocking, from `pinned` memory), `warm_up` runs every unit (the round unit's
    too), fixed K drafts through the round unit, the
    profile's marks are events (`HostEvent`, the CPU stand-in of CUDA events); the greedy tokens are eager
    autoregressive decoding's."""
    target, draft = tiny_llama_pair
    head = AcceptanceHead(draft.config.hidden_size, depth=1)
    reference = _ar_greedy(target, PROMPT, 24)
    calls = Counter()

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(device_path, "pinned", spy("pinned", device_path.pinned))
    monkeypatch.setattr(device_path, "device_event", spy("event", device_path.device_event))
    monkeypatch.setattr(ModelDrafter, "propose_block", spy("block", ModelDrafter.propose_block))
    dec = SpeculativeDecoder(target, draft, policy=spec, head=head, compile=False, device_path=True)
    dec.warm_up(64)  # what a CUDA user's bench runs first: every unit once (the round unit's included)
    warm_blocks = calls["block"]
    res = dec.generate(PROMPT, max_new_tokens=24, temperature=0, profile=True)
    assert res.new_ids.tolist() == reference
    assert calls["pinned"] == 1  # the prompt's one upload
    assert calls["event"] == 3 * res.rounds  # three marks per round
    assert len(res.phases["draft_ms"]) == len(res.phases["verify_ms"]) == res.rounds
    assert 0 < sum(res.phases["draft_ms"]) + sum(res.phases["verify_ms"]) <= res.wall_time * 1e3
    if spec.startswith("specdec:"):
        full = sum(d == 3 for d in res.drafted_per_round)  # rounds not cut by the token budget
        assert calls["block"] - warm_blocks == full > 0
    else:
        assert calls["block"] == 0


def test_device_path_samples_from_the_target():
    """Under sampling (T = 1) the device path (round unit, static caches) decodes 3-token continuations
    distributed as the target's (chi-square against exact enumeration, as tests/test_exactness.py)."""
    target = _peaked_llama(12, seed=3)
    draft = _perturbed(target, 0.5, seed=4)
    dec = SpeculativeDecoder(target, draft, policy="specdec:k=2", compile=False, device_path=True)
    assert dec.drafter.round_unit
    n, prompt = 250, [1, 4]
    counts = Counter(
        tuple(dec.generate(torch.tensor(prompt), max_new_tokens=3, temperature=1.0, seed=s).new_ids.tolist())
        for s in range(n)
    )
    expected = _exact_sequences(target, prompt, 3, SamplingConfig(1.0))
    assert _chi_square_p_value(counts, expected, n) > 1e-3


def test_compiled_unit_on_the_device_path_copies_its_outputs(tiny_tokenizer, monkeypatch):
    """The device path's compiled units: `torch.compile` with CUDA graphs (`mode="reduce-overhead"`'s option)
    and no split reductions (on CPU tensors Inductor
    skips the CUDA-graph capture and runs the same kernels), and every replay's outputs copied out
    (`copy_out`). An autoregressive decode compiles one unit (the one-token verification); its tokens are
    eager decoding's. Own models: a model's compiled runner serves one device path."""
    target = make_tiny_llama(len(tiny_tokenizer), hidden_size=64, num_layers=2, seed=1)
    modes, copies = [], []
    compile_, copy_out = torch.compile, static_runner.copy_out

    def compile_spy(fn, **kwargs):
        modes.append(kwargs.get("options"))
        return compile_(fn, **kwargs)

    def copy_spy(out):
        copied = copy_out(out)
        copies.append(all(a is not b for a, b in zip(out, copied, strict=True)))
        return copied

    monkeypatch.setattr(torch, "compile", compile_spy)
    monkeypatch.setattr(static_runner, "copy_out", copy_spy)
    dec = SpeculativeDecoder(target, None, policy="autoregressive", device_path=True)
    assert dec.fast and modes == [{"triton.cudagraphs": True, "split_reductions": False}]
    got = dec.generate(PROMPT, max_new_tokens=12, temperature=0)
    assert got.new_ids.tolist() == _ar_greedy(target, PROMPT, 12)
    assert len(copies) == got.rounds - 1 and all(copies)  # every replay (the prompt's forward is eager)
    with pytest.raises(AccheadError, match="on=True"):
        make_runner(target, fast=True, device_path=False)


@pytest.mark.parametrize(
    "spec", [pytest.param("specdec:k=3", marks=pytest.mark.slow), "specdecpp:h=0.5,max=6"]
)  # the round unit's variant is slow (~20 s of tracing), like its Inductor twin
def test_cudagraphs_backend_compiles_without_inductor(tiny_tokenizer, monkeypatch, spec):
    """`DevicePath(True, backend="cudagraphs")`: every unit goes to torch's `cudagraphs` backend (on CPU
    tensors it skips the capture and runs the traced graph eagerly: the twin of the CUDA run, without
    Inductor's minutes of code generation), fixed K through its round unit, SpecDec++ with the head inside
    its draft steps and its long rounds through static padded widths (the backend replays the first size a
    graph saw: a symbolic width failed SpecDec++'s warm-up on an H200, 8 tokens fed into a graph of 6);
    nothing compiles after `warm_up`, and the greedy tokens are autoregressive decoding's."""
    vocab = len(tiny_tokenizer)
    target = make_tiny_llama(vocab, hidden_size=64, num_layers=2, seed=1)
    draft = make_tiny_llama(vocab, hidden_size=32, num_layers=2, seed=2)
    head = AcceptanceHead(draft.config.hidden_size, depth=1)
    backends, compile_ = [], torch.compile

    def compile_spy(fn, **kwargs):
        backends.append((kwargs.get("backend"), kwargs.get("mode")))
        return compile_(fn, **kwargs)

    monkeypatch.setattr(torch, "compile", compile_spy)
    path = DevicePath(True, backend="cudagraphs")
    dec = SpeculativeDecoder(target, draft, policy=spec, head=head, device_path=path)
    assert dec.fast and dec.drafter.round_unit and dec._runner.path is path and not dec._verifier.symbolic
    assert backends == [("cudagraphs", None)] * 2  # the target's runner and the draft's
    dec.warm_up(64, temperature=0.0)
    with torch.compiler.set_stance("fail_on_recompile"):
        greedy = dec.generate(PROMPT, max_new_tokens=24, temperature=0).new_ids.tolist()
    assert greedy == _ar_greedy(target, PROMPT, 24)
    with pytest.raises(AccheadError, match="backend='cudagraphs'"):
        make_runner(target, fast=True, device_path=True)  # a model's runner serves one backend


def test_read_suspends_cuda_sync_debug_mode(monkeypatch):
    """`host_reads.read` of a CUDA tensor under the sync debug mode turns the mode off for its own read and
    back on after; a CPU tensor never asks (a CPU-only torch has no mode). The CUDA calls are replaced, and
    a tensor that says it is on CUDA takes the branch."""

    class CudaLooking(torch.Tensor):
        @property
        def is_cuda(self) -> bool:
            return True

    modes: list[int] = []
    monkeypatch.setattr(host_reads, "_sync_debug_mode", lambda: 2)
    monkeypatch.setattr(host_reads, "_set_sync_debug_mode", modes.append)
    count0 = host_reads.count
    assert host_reads.read(torch.tensor([3, 4]).as_subclass(CudaLooking)) == [3, 4]
    assert modes == [0, 2]
    assert host_reads.read(torch.tensor(5)) == 5 and modes == [0, 2]
    assert host_reads.count - count0 == 2


def test_host_event_times_like_perf_counter():
    clock = PhaseClock(torch.device("cpu"))
    assert clock.elapsed_ms() == []
    for _ in range(3):
        clock.mark()
    assert all(isinstance(m, HostEvent) for m in clock.marks)
    ms = clock.elapsed_ms()
    assert len(ms) == 2 and all(0 <= x < 1e3 for x in ms)
    with pytest.raises(RuntimeError, match="both events"):
        HostEvent().elapsed_time(clock.marks[0])


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["specdec:k=2", "specdecpp:h=0.5,max=6"])
def test_compiled_device_path_round_and_stop_units(tiny_tokenizer, spec):
    """The whole CUDA default on the CPU: fixed K's compiled round unit and SpecDec++'s compiled draft steps
    with the head inside, graph-replay mode, greedy and sampled, nothing compiled after `warm_up`; greedy
    tokens are autoregressive decoding's, sampled ones the eager path's (the same counter-keyed draws).
    SpecDec++'s cap of 6 takes its longer rounds through the padded widths 6 and 8 of the symbolic graph.
    Slow: about 60 s (SpecDec++) to 5 min (fixed K, contended box) of compilation on 2 CPU cores."""
    vocab = len(tiny_tokenizer)
    target = make_tiny_llama(vocab, hidden_size=64, num_layers=2, seed=1)
    draft = make_tiny_llama(vocab, hidden_size=32, num_layers=2, seed=2)
    head = AcceptanceHead(draft.config.hidden_size, depth=1)
    dec = SpeculativeDecoder(target, draft, policy=spec, head=head, device_path=True)
    eager = SpeculativeDecoder(target, draft, policy=spec, head=head, fast=False)
    assert dec.fast and dec.drafter.round_unit
    for t in (0.0, 1.0):
        dec.warm_up(64, temperature=t)
    with torch.compiler.set_stance("fail_on_recompile"):
        greedy = dec.generate(PROMPT, max_new_tokens=24, temperature=0).new_ids.tolist()
        sampled = dec.generate(PROMPT, max_new_tokens=24, temperature=1.0, seed=3).new_ids.tolist()
    assert greedy == _ar_greedy(target, PROMPT, 24)
    assert sampled == eager.generate(PROMPT, max_new_tokens=24, temperature=1.0, seed=3).new_ids.tolist()


@torch.inference_mode()
def test_symbolic_verification_branch_on_the_cpu(tiny_tokenizer):
    """The device path's long rounds (from `SYMBOLIC_FROM` tokens fed) go to one graph symbolic in the count:
    run uncompiled here, the branch marks its inputs dynamic, feeds the padded width, and returns the status
    of the padded static unit and of the unpadded eager verification alike; a symbolic verifier that does
    not pad is refused."""
    target = make_tiny_llama(len(tiny_tokenizer), hidden_size=32, num_layers=2, seed=1)
    vocab = target.config.vocab_size
    g = torch.Generator().manual_seed(0)
    seq = torch.cat([PROMPT, torch.randint(0, vocab, (7,), generator=g)])
    n, num = PROMPT.numel() + 1, 5  # one committed token after the prompt, then 5 candidates: 6 fed
    assert verify_width(num + 1) >= SYMBOLIC_FROM
    q = torch.softmax(torch.randn(num, vocab, generator=g), -1)
    steps = [DraftStep(token=int(seq[n + i]), q=q[i], hidden=None, index=i + 1) for i in range(num)]
    statuses, fed = [], []
    for padded, symbolic in ((False, False), (True, False), (True, True)):
        runner = StaticRunner(target, compile=False)
        runner.reset(64)
        runner.feed(seq[: n - 1])  # the prompt's forward, as a decode's first round makes it
        feed = runner.feed
        runner.feed = lambda *a, _feed=feed, **kw: fed.append(kw.get("symbolic", 0)) or _feed(*a, **kw)
        verifier = RoundVerifier(runner, verify_token, vocab, target.device, key_tensors=False,
                                 padded=padded, symbolic=symbolic)  # fmt: skip
        status = verifier.verify(seq.clone(), n, steps, SamplingConfig(1.0), seed=3)
        statuses.append(status[: 2 + num].tolist())
    assert statuses[0] == statuses[1] == statuses[2]
    assert fed == [0, 0, SYMBOLIC_FROM]  # only the symbolic verifier asked its runner for a symbolic count
    with pytest.raises(ValueError, match="pass padded=True"):
        RoundVerifier(runner, verify_token, vocab, target.device, key_tensors=False, symbolic=True)
    with pytest.raises(ValueError, match="padded verification units"):  # only the fast path warms up
        RoundVerifier(runner, verify_token, vocab, target.device, key_tensors=False).warm_up(
            64, 3, SamplingConfig(0.0))
