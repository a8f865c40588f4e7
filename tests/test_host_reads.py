"""Device-to-host reads of the decoding loop: all through `host_reads.read`, within the per-round budget.

On the CPU a read costs nothing, so the budget is checked by counting, not timing. Every way Python code
can pull a tensor's value to the host (`item`, `tolist`, `numpy`, `bool()`, `int()`, `float()`, indexing
with a tensor as a Python int) is wrapped for the duration of a decode; each call is attributed to the
innermost frame outside torch. Calls from the decoding package (`acchead.inference`) other than
`host_reads.read` fail the test; calls from transformers' own eager code (its mask helpers) are not the
decoder's and are left out (they vanish under compilation).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest
import torch

from acchead.head import AcceptanceHead
from acchead.inference import SpeculativeDecoder, host_reads
from acchead.inference.policies import StopPolicy

INFERENCE_DIR = str(Path(host_reads.__file__).resolve().parent)
TORCH_DIR = str(Path(torch.__file__).resolve().parent)
READ_METHODS = ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def record_reads():
    """Yields a list that collects 'file:line' of every read made outside host_reads.read."""
    stray: list[str] = []
    originals = {name: getattr(torch.Tensor, name) for name in READ_METHODS}

    def wrap(name):
        original = originals[name]

        def reader(self, *args, **kwargs):
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith(TORCH_DIR):
                frame = frame.f_back
            if frame is not None:
                path = str(Path(frame.f_code.co_filename).resolve())
                if path.startswith(INFERENCE_DIR) and not path.endswith("host_reads.py"):
                    stray.append(f"{Path(path).name}:{frame.f_lineno} ({name})")
            return original(self, *args, **kwargs)

        return reader

    for name in READ_METHODS:
        setattr(torch.Tensor, name, wrap(name))
    try:
        yield stray
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def test_the_recorder_catches_a_read_in_the_decoding_package():
    """Negative control: a policy that reads its flag with bool() is caught."""
    from acchead.inference import policies

    with record_reads() as stray:
        exec(compile("bool(torch.tensor(True))", policies.__file__, "exec"), {"torch": torch})
    assert len(stray) == 1 and stray[0].startswith("policies.py:")


def _judged_counter(policy: StopPolicy) -> list[int]:
    calls = [0]
    inner = policy.should_stop

    def counted(run, step):
        calls[0] += 1
        return inner(run, step)

    policy.should_stop = counted  # type: ignore[method-assign]
    return calls


def _heads(draft) -> dict[str, AcceptanceHead]:
    torch.manual_seed(0)
    hidden = draft.config.hidden_size
    return {"candidate": AcceptanceHead(hidden, 2),
            "lookahead": AcceptanceHead(hidden, 2, kind="lookahead", inputs=("state", "token"))}  # fmt: skip


@pytest.mark.parametrize("fast", [False, True], ids=["eager", "static-cache"])
@pytest.mark.parametrize("verifier", ["token", "block"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "T1"])
def test_fixed_k_reads_once_per_round_and_nowhere_else(tiny_llama_pair, fast, verifier, temperature):
    target, draft = tiny_llama_pair
    dec = SpeculativeDecoder(target, draft, policy="specdec:k=3", verifier=verifier, fast=fast, compile=False)
    before = host_reads.count
    with record_reads() as stray:
        res = dec.generate(torch.tensor([3, 7, 11]), max_new_tokens=24, temperature=temperature, seed=2)
    assert stray == []
    assert host_reads.count - before == res.rounds == res.host_reads


def test_profile_times_every_round_and_a_bare_replay(tiny_llama_pair):
    from acchead.inference.bench.loop_profile import profile_loop, profile_table
    from acchead.sampling import SamplingConfig

    target, draft = tiny_llama_pair
    dec = SpeculativeDecoder(target, draft, policy="specdec:k=3")
    res = dec.generate(torch.tensor([3, 7, 11]), max_new_tokens=16, temperature=0.0, profile=True)
    ph = res.phases
    assert len(ph["draft_ms"]) == len(ph["verify_ms"]) == len(ph["draft_forwards"]) == res.rounds
    assert sum(ph["draft_forwards"]) == res.draft_calls and all(t > 0 for t in ph["verify_ms"])
    # The first round feeds the prompt and K candidates, later ones the next token and up to K candidates.
    assert ph["verify_tokens"][0] == 3 + 3 and set(ph["verify_tokens"][1:]) <= {2, 3, 4}
    prof = profile_loop(dec, [torch.tensor([3, 7, 11])], 16, SamplingConfig(0.0), reps=2)
    assert prof.host_reads_per_round == 1.0 and prof.bare_draft_ms > 0 and prof.bare_target_ms > 0
    assert prof.verify_tokens in (2, 3, 4)  # a decode round's, never the prompt's prefill
    assert prof.verify_vs_bare == prof.verify_ms / prof.bare_target_ms
    assert "specdec:k=3" in profile_table([prof.to_dict()])


@pytest.mark.parametrize(
    "spec", ["specdecpp:h=0.5", "specdecpp-lookahead", "confidence:tau=0.5", "entropy:tau=0.5",
             "adaedl:lam=0.5"],
)
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "T1"])
def test_threshold_rules_read_once_per_judged_candidate_plus_once_per_round(tiny_llama_pair, spec,
                                                                             temperature):
    target, draft = tiny_llama_pair
    heads = _heads(draft)
    head = heads["lookahead"] if spec.endswith("lookahead") else heads["candidate"]
    dec = SpeculativeDecoder(target, draft, policy=spec.replace("-lookahead", ":h=0.5"), head=head)
    judged = _judged_counter(dec.policy)
    before = host_reads.count
    with record_reads() as stray:
        res = dec.generate(torch.tensor([3, 7, 11]), max_new_tokens=24, temperature=temperature, seed=2)
    assert stray == []
    assert judged[0] > 0
    assert host_reads.count - before == res.rounds + judged[0]
