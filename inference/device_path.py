"""The device path: what the decoders do by default on an accelerator, and the switch that runs it on the CPU.

On CUDA a decoder by default takes the fast path (static caches, compiled units), drafts a fixed-K round as
one unit (`ModelDrafter.propose_block`), captures each unit as a CUDA graph (`torch.compile`'s
`mode="reduce-overhead"`, the weights left as graph inputs rather than frozen) and copies a replay's outputs
out before the next replay overwrites them. On the CPU each of those is opt-in. No GPU is lent to most CI
runs, so `DevicePath(on=True)` (`device_path=True` on `SpeculativeDecoder`, `ModelDrafter` and
`make_runner`) takes every one of those branches on the CPU too, and the default suite runs them
(tests/test_device_path.py; the branches and their tests are listed in docs/testing.md).

Three calls have no CPU form; each sits in one small function here, so that everything around it is the
same code on both devices:
- `device_event`: a CUDA event (recorded on the stream without a sync), on the CPU a `HostEvent` stamped
  with `perf_counter` (every CPU op has finished when Python moves on, so the stamp is the event's time);
- `pinned`: page-locked host memory for a non-blocking upload (a pageable host-to-device copy syncs the
  stream); a CPU tensor is already where it goes;
- the CUDA graph itself: Inductor skips graph capture for CPU tensors and runs the same compiled kernels,
  so the CPU twin checks everything around the capture (the unit's tracing, the output copies), not the
  capture.
`acchead.inference.host_reads.read` has the fourth (CUDA's sync debug mode, a test instrument; its CPU twin
is tests/test_host_reads.py's recorder).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

# How the device path compiles a unit for graph replay (`DevicePath.backend`).
BACKENDS = ("inductor", "cudagraphs")


@dataclass(frozen=True)
class DevicePath:
    """Whether a model's decoding takes the device path (see the module docstring), and how it compiles.

    Attributes:
        on: take the device path: fast path and fixed-K round unit by default, units compiled for graph
            replay (`compile_options`) with their outputs copied out (`copy_outputs`).
        backend: how a unit becomes a replayable graph on the device path. "inductor" (the default):
            Inductor's fused kernels captured as CUDA graphs (`mode="reduce-overhead"`); an H100 spent
            24-86 s compiling each decoder (docs/speed.md). "cudagraphs": torch's `cudagraphs` backend,
            the traced graph's own (unfused) kernels captured as CUDA graphs, with no Inductor code
            generation: a short warm-up for slower kernels (on the CPU the graph runs uncaptured, eagerly).
        regional: off the device path, compile a model's repeated decoder layers once per unit rather than
            once per layer (`acchead.inference.compile_regions`): None where the layers are wide enough
            to run about as fast (the real target's, not the demo target's), True for any model, False
            never (whole-model units, as a model of one layer gets: the real pair's draft). Every CPU
            unit, regional or whole, is kept in the store of compiled units
            (`acchead.inference.unit_store`). Not on the device path, where it has not run on a GPU yet.
    """

    on: bool
    backend: str = "inductor"
    regional: bool | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown compile backend {self.backend!r}; choose from {', '.join(BACKENDS)}")
        if self.backend != "inductor" and not self.on:
            raise ValueError(f"the {self.backend!r} backend is a device-path choice: pass on=True")
        if self.regional and self.on:
            raise ValueError("regional compilation is a CPU-path choice (untried on a GPU): pass on=False")

    @classmethod
    def resolve(cls, device: torch.device, device_path: bool | DevicePath | None) -> DevicePath:
        """`device_path` itself when it is a `DevicePath`, else on when it says so, or by default on exactly
        when `device` is CUDA (with the default backend)."""
        if isinstance(device_path, DevicePath):
            return device_path
        return cls(device.type == "cuda" if device_path is None else bool(device_path))

    @property
    def compile_options(self) -> dict[str, Any]:
        """`torch.compile`'s backend and options: CUDA graphs on the device path (a CPU graph runs
        uncaptured), through Inductor (`mode="reduce-overhead"`'s one option, `triton.cudagraphs`) or the
        `cudagraphs` backend; else Inductor's default mode (on the CPU the caller adds Inductor's C++
        wrapper to a whole-model unit: `acchead.inference.compiled_units`).

        Why no split reductions on the device path: the real target's softmax over its 49,152-token
        vocabulary is one row, which Inductor splits across blocks; torch 2.11's Triton code generation
        then failed on the split's second stage (`assert self.inside_reduction`, an H200, 2026-11-28,
        docs/speed.md) before the first token. One block per row is what a decoding step's few rows need."""
        if self.backend == "cudagraphs":
            return {"backend": "cudagraphs"}
        return {"options": {"triton.cudagraphs": True, "split_reductions": False}} if self.on else {}

    @property
    def symbolic_shapes(self) -> bool:
        """Whether compiled units may take a symbolic token count (`torch._dynamo.mark_dynamic`): on the
        device path through Inductor, whose CUDA-graph trees record one graph per size. The `cudagraphs`
        backend replays the graph of the first size it saw, so a symbolic count fed a new size into the
        captured inputs (an H200 failed SpecDec++'s warm-up so, 2026-11-28): it gets a static graph per
        width."""
        return self.on and self.backend == "inductor"

    @property
    def copy_outputs(self) -> bool:
        """Whether a compiled unit's outputs must be copied: a CUDA-graph replay writes its outputs into the
        same buffers every time, so a tensor handed out would change under its holder at the next replay."""
        return self.on

    @property
    def fast_default(self) -> bool:
        """The fast path unless the caller chose: on the device path (the CPU pays tens of seconds of
        compilation before its first token, so there it is opt-in)."""
        return self.on

    @property
    def round_unit_default(self) -> bool:
        """Draft a fixed-K round as one unit: on the device path it saves K - 1 launches and host round
        trips per round; on the CPU a compiled K-step graph measured slower than K one-step graphs
        (docs/speed.md)."""
        return self.on


class HostEvent:
    """The CPU stand-in of `torch.cuda.Event(enable_timing=True)`: the same three calls, timed by
    `perf_counter` at `record` (on the CPU every op has finished when Python records)."""

    def __init__(self) -> None:
        self._t: float | None = None

    def record(self) -> None:
        self._t = time.perf_counter()

    def synchronize(self) -> None:
        """Nothing to wait for on the CPU."""

    def elapsed_time(self, end: HostEvent) -> float:
        """Milliseconds from this event to `end` (both recorded)."""
        if self._t is None or end._t is None:
            raise RuntimeError("elapsed_time needs both events recorded")
        return (end._t - self._t) * 1e3


def device_event(device: torch.device) -> Any:
    """A timing event on `device`'s stream: a CUDA event, or a `HostEvent` on the CPU."""
    return torch.cuda.Event(enable_timing=True) if device.type == "cuda" else HostEvent()


def pinned(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` in memory a non-blocking copy to `device` can read without a sync: page-locked for CUDA (a
    pageable host-to-device copy synchronises the stream); unchanged for the CPU."""
    return host.pin_memory() if device.type == "cuda" else host


def upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` on `device` without blocking the host: the prompt's one host-to-device copy per decode."""
    return pinned(host, device).to(device, non_blocking=True)


class PhaseClock:
    """Timestamps inside a decode: events recorded on the device's stream without a sync and read once
    at the end (`HostEvent`s on the CPU), so profiling adds no synchronisation to the loop."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.marks: list[Any] = []

    def mark(self) -> None:
        event = device_event(self.device)
        event.record()
        self.marks.append(event)

    def elapsed_ms(self) -> list[float]:
        """Milliseconds between consecutive marks (waits once, for the last)."""
        if not self.marks:
            return []
        self.marks[-1].synchronize()
        return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:], strict=False)]
