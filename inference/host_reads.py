"""The one way the decoding loop reads a device tensor on the host.

On a GPU every read of a device value (`int(t)`, `t.item()`, `t.tolist()`, `if t:`) waits for the stream
to drain: the host stops feeding kernels until the device catches up, which is what made a draft step cost
3.5x a bare draft replay on an H100. The decoders therefore keep tokens, draft distributions, stop
statistics and verification on the device and read back only what the host must branch on:

- one packed status per verification round (τ, the next token and the round's candidates), which the
  host needs for EOS, the streamer and the cache lengths;
- one stop flag per judged candidate for threshold rules (SpecDec++, confidence, entropy, AdaEDL): torch
  2.11-2.13 cannot keep a data-dependent loop on the device (`torch.cond` lowers to a host branch), so an
  adaptive round asks the device once per decision.

Every such read goes through `read`, which counts them (`count`), so tests can assert the budget: at most
one read per round for fixed K and 1 + (judged candidates) for threshold rules, and no other read anywhere
in the decoding code. Host-driven parts say so where they read: the Max-Gram drafter and cascades (their
proposals are host computations) and the oracle's hindsight reference.
"""

from __future__ import annotations

from typing import Any

import torch

count = 0  # reads made through `read` since the process started; tests take differences


def read(t: torch.Tensor) -> Any:
    """`t.tolist()` (a Python scalar for a 0-d tensor), counted as one device-to-host read.

    Allowed under `torch.cuda.set_sync_debug_mode("error")`, which the GPU tests set around a decode so that
    any other synchronisation in the decoding code fails."""
    global count
    count += 1
    mode = _sync_debug_mode() if t.is_cuda else 0
    if not mode:
        return t.tolist()
    _set_sync_debug_mode(0)  # this read is the one the budget allows
    try:
        return t.tolist()
    finally:
        _set_sync_debug_mode(mode)


# CUDA's sync debug mode, looked up at call time: the CPU suite replaces these two to run `read`'s CUDA
# branch (tests/test_device_path.py); a CPU-only torch has no mode to read.
def _sync_debug_mode() -> int:
    return torch.cuda.get_sync_debug_mode()


def _set_sync_debug_mode(mode: int) -> None:
    torch.cuda.set_sync_debug_mode(mode)
