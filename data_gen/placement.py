"""Where each gen-data process puts its models when the target is sharded (`--device-map`, DESIGN §8).

A 70B-class target does not fit one GPU, so each process shards its own copy over a group of GPUs, and
several processes (`accelerate launch --num_processes N`) label disjoint batches side by side. With G GPUs
visible on a node and N processes there, process r (its local rank) gets the contiguous group
r*G/N .. (r+1)*G/N - 1, or the group the user names with `--process-gpus "0,1;2,3;..."`. The process's
target is restricted to its group through `max_memory` (transformers' device_map places no weight on a
GPU without a budget) and its draft sits on the group's first GPU. Everything here is pure, so the
assignment and its refusals are tested without GPUs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from acchead.errors import AccheadError

# transformers' device_map strategies, which place a model over whatever GPUs have a memory budget.
STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
# Share of a GPU's free memory a process's target may fill: the rest is for activations and logits, as
# transformers keeps for device_map="auto" without a user budget (it takes 90%).
MEMORY_SHARE = 0.9


def parse_process_gpus(text: str) -> list[list[int]]:
    """`--process-gpus` text -> one GPU list per process: "0,1;2,3" -> [[0, 1], [2, 3]].

    Checks the syntax and that no GPU is named twice; the count of processes and GPUs is checked at run
    time (`process_gpus`).
    """
    groups = []
    for part in text.split(";"):
        try:
            group = [int(g) for g in part.split(",")]
        except ValueError:
            raise AccheadError(
                f"--process-gpus {text!r}: expected GPU indices, ',' within a process, ';' between processes "
                "(e.g. '0,1;2,3')"
            ) from None
        if any(g < 0 for g in group):
            raise AccheadError(f"--process-gpus {text!r}: GPU indices must be >= 0")
        groups.append(group)
    named = [g for group in groups for g in group]
    if len(named) != len(set(named)):
        dup = next(g for g in named if named.count(g) > 1)
        raise AccheadError(f"--process-gpus {text!r}: GPU {dup} is given to more than one process")
    return groups


def process_gpus(
    rank: int, num_processes: int, num_gpus: int, mapping: list[list[int]] | None = None
) -> list[int]:
    """The local GPUs that process `rank` of `num_processes` (on this node) shards its target over.

    Without a mapping: the contiguous group rank*G/N .. (rank+1)*G/N - 1 of the G = `num_gpus` visible
    GPUs; refused unless every process gets the same number (N <= G and G divisible by N). With a mapping
    (`parse_process_gpus`): its rank-th group, refused unless it has one group per process and names only
    visible GPUs.
    """
    if not 0 <= rank < num_processes:
        raise ValueError(f"rank {rank} outside {num_processes} processes")
    if mapping is not None:
        if len(mapping) != num_processes:
            raise AccheadError(
                f"--process-gpus gives {len(mapping)} GPU groups for {num_processes} processes; give one per "
                "process"
            )
        bad = sorted({g for group in mapping for g in group if g >= num_gpus})
        if bad:
            raise AccheadError(
                f"--process-gpus names GPU {bad[0]}, but {num_gpus} are visible (0..{num_gpus - 1})"
            )
        return list(mapping[rank])
    if num_gpus == 0:
        raise AccheadError(
            f"--device-map with {num_processes} processes shards the target over each process's GPUs, "
            "but no GPU is visible; use one process"
        )
    if num_processes > num_gpus:
        raise AccheadError(
            f"--device-map: {num_processes} processes cannot each shard the target over its own GPUs with "
            f"{num_gpus} GPUs visible; use at most {num_gpus} processes"
        )
    if num_gpus % num_processes:
        raise AccheadError(
            f"--device-map: {num_gpus} GPUs do not split evenly over {num_processes} processes; use a "
            f"number of processes that divides {num_gpus}, or name each process's GPUs with --process-gpus"
        )
    per = num_gpus // num_processes
    return list(range(rank * per, (rank + 1) * per))


@dataclass(frozen=True)
class Placement:
    """How one process loads its models: the target's `device_map` and `max_memory` (None: no restriction,
    every visible GPU), and the draft's device (None: the process's default device)."""

    device_map: str | None
    max_memory: dict[int | str, int] | None
    draft_device: str | None


def placement(
    device_map: str | None,
    mapping: list[list[int]] | None,
    rank: int,
    num_processes: int,
    num_gpus: int,
    free_memory: Callable[[int], int],
) -> Placement:
    """The models' placement in process `rank` of `num_processes` on a node with `num_gpus` visible GPUs.

    Without `--device-map`, the target sits on one device like the draft. With it and one process (and no
    mapping), transformers shards the target over every visible GPU, as before. With several processes or
    a mapping, the target is sharded over the process's group only (`process_gpus`): `device_map` must then
    be one of `STRATEGIES`, the group's budgets are MEMORY_SHARE of `free_memory(gpu)` bytes each, and the
    draft goes on the group's first GPU.
    """
    if device_map is None:
        if mapping is not None:
            raise AccheadError("--process-gpus names the GPUs a sharded target uses: give --device-map too")
        return Placement(None, None, None)
    if num_processes == 1 and mapping is None:
        return Placement(device_map, None, None)
    if device_map not in STRATEGIES:
        raise AccheadError(
            f"--device-map {device_map!r} with several processes or --process-gpus: give a strategy "
            f"({', '.join(STRATEGIES)}) for each process to apply to its own GPUs"
        )
    gpus = process_gpus(rank, num_processes, num_gpus, mapping)
    budget: dict[int | str, int] = {g: int(MEMORY_SHARE * free_memory(g)) for g in gpus}
    return Placement(device_map, budget, f"cuda:{gpus[0]}")
