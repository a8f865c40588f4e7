"""Choosing the demo target's shape: the operators one decode step dispatches, and the deep-narrow candidates.

    acchead-build-zoo --stage arch          # the candidate table and the pick
    acchead-build-zoo --stage arch --time   # ... with each shape's measured one-token step

Why operators: a small model's one-token step on a GPU is bound by how many kernels it launches, not by
its bytes or FLOPs (issue 21: a captured H100 step costs 0.21 ms at 2 layers x 128, 0.58 ms at 6 x 256,
1.49 ms at 12 x 1024: depth sets the price, width barely). Without a GPU, the number of aten operators an
eager one-token forward dispatches (what an eager GPU forward launches, give or take views) stands in for
that cost: `count_step_ops` counts them with a `TorchDispatchMode`. The draft/target ratio of those counts
is the cost ratio a speculative decoder sees; deployed pairs run at 0.05-0.2.

The candidates keep today's target's parameter count (the same FLOPs per trained token, the same shipped
size): for each depth and width the MLP's intermediate size is solved for it (`intermediate_for`). The pick
(`pick_target`): op ratio at most `max_ratio`; parameters within `tolerance` of the reference; then the
FEWEST layers (depth is what a GPU step pays for, so any layer beyond the ratio target only slows the
target and its training), then the parameter count nearest the reference, then the wider shape.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from acchead.errors import AccheadError
from acchead.rundir import atomic_write_json

if TYPE_CHECKING:
    from transformers import LlamaConfig

VOCAB_SIZE = 4096  # the demo tokenizer's
DEFAULT_DEPTHS = (6, 12, 16, 20, 21, 22, 24)
DEFAULT_WIDTHS = (128, 160, 192, 256)
MLP_RATIO_RANGE = (2.0, 8.0)  # intermediate / hidden outside this is not a sensible Llama MLP


@dataclass(frozen=True)
class Shape:
    """A Llama decoder's shape (multi-head attention: as many key/value heads as query heads)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    intermediate_size: int

    def label(self) -> str:
        return f"{self.num_layers}x{self.hidden_size} (heads {self.num_heads}, mlp {self.intermediate_size})"


def llama_config(shape: Shape, vocab_size: int = VOCAB_SIZE, max_positions: int = 1024,
                 special_id: int = 0) -> LlamaConfig:
    """The demo pair's Llama config for `shape` (tied embeddings; `special_id`: EOS = BOS = padding)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=special_id,
        eos_token_id=special_id,
        pad_token_id=special_id,
    )


def llama_params(shape: Shape, vocab_size: int = VOCAB_SIZE) -> int:
    """Parameter count of the tied-embedding Llama: embedding, per layer 4 attention projections, the
    3 MLP matrices and 2 RMSNorms, and the final norm."""
    h, i = shape.hidden_size, shape.intermediate_size
    return vocab_size * h + shape.num_layers * (4 * h * h + 3 * h * i + 2 * h) + h


def heads_for(hidden_size: int, head_dim: int = 64) -> int:
    """The head count whose (even) head size is nearest `head_dim`; ties go to more heads."""
    options = [n for n in range(1, hidden_size + 1) if hidden_size % n == 0 and (hidden_size // n) % 2 == 0]
    if not options:
        raise AccheadError(f"hidden size {hidden_size} has no even head size")
    return min(options, key=lambda n: (abs(hidden_size // n - head_dim), -n))


def intermediate_for(num_layers: int, hidden_size: int, params: int, vocab_size: int = VOCAB_SIZE,
                     multiple: int = 32) -> int:
    """The MLP size (a multiple of `multiple`, at least one) that brings the shape nearest `params`."""
    h = hidden_size
    fixed = vocab_size * h + num_layers * (4 * h * h + 2 * h) + h
    exact = (params - fixed) / (3 * h * num_layers)
    return max(multiple, multiple * round(exact / multiple))


@dataclass(frozen=True)
class OpCount:
    """Operators one eager one-token forward dispatches."""

    dispatched: int  # every aten operator (the measure: 136 for 2 x 128, 356 for 6 x 256)
    non_view: int  # less the view/alias operators, which launch no kernel on a GPU


def count_step_ops(config: LlamaConfig, context: int = 128) -> OpCount:
    """Aten operators dispatched by one KV-cached one-token forward after a `context`-token prefill.

    Eager, under `torch.inference_mode`, with transformers' default attention (SDPA) and a `DynamicCache`:
    how the demo pair decodes without compilation. The count does not depend on the weights' values, the
    width, or the number of heads (one SDPA call covers them all); it grows with depth.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import DynamicCache, LlamaForCausalLM

    from acchead.models import CACHE_ARG

    class Counter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.dispatched = self.non_view = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.dispatched += 1
            self.non_view += not func.is_view
            return func(*args, **(kwargs or {}))

    model = LlamaForCausalLM(config).eval()
    with torch.inference_mode():
        cache = DynamicCache()
        x = torch.randint(1, config.vocab_size, (1, context + 1), generator=torch.Generator().manual_seed(0))
        model(input_ids=x[:, :-1], **{CACHE_ARG: cache}, use_cache=True)
        counter = Counter()
        with counter:
            model(input_ids=x[:, -1:], **{CACHE_ARG: cache}, use_cache=True)
    return OpCount(counter.dispatched, counter.non_view)


@dataclass
class Candidate:
    """One row of the shape table."""

    shape: Shape
    params: int
    ops: int  # dispatched operators of one one-token step
    non_view_ops: int
    op_ratio: float  # the draft's dispatched ops / this shape's
    mlp_ratio: float  # intermediate / hidden
    step_ms: float | None = None  # measured one-token step (`--time`)
    step_ratio: float | None = None  # the draft's step ms / this shape's


def candidate_table(draft: Shape, reference_params: int, depths: tuple[int, ...] = DEFAULT_DEPTHS,
                    widths: tuple[int, ...] = DEFAULT_WIDTHS, context: int = 128, time_steps: bool = False,
                    device: str = "cpu") -> tuple[Candidate, list[Candidate]]:
    """(the draft's row, one row per depth x width at `reference_params`), with op counts and, with
    `time_steps`, each shape's measured one-token step on `device`."""
    import torch
    from tqdm import tqdm
    from transformers import LlamaForCausalLM

    from acchead.step_cost import decode_step_ms

    def row(shape: Shape, draft_row: Candidate | None) -> Candidate:
        cfg = llama_config(shape)
        ops = count_step_ops(cfg, context)
        c = Candidate(shape, llama_params(shape), ops.dispatched, ops.non_view,
                      draft_row.ops / ops.dispatched if draft_row else 1.0,
                      shape.intermediate_size / shape.hidden_size)
        if time_steps:
            torch.manual_seed(0)
            model = LlamaForCausalLM(cfg).eval().to(device)
            c.step_ms = decode_step_ms(model, context=context, calls=50)
            c.step_ratio = draft_row.step_ms / c.step_ms if draft_row else 1.0  # type: ignore[operator]
        return c

    draft_row = row(draft, None)
    shapes = [Shape(d, w, heads_for(w), intermediate_for(d, w, reference_params))
              for d in depths for w in widths]
    rows = [row(s, draft_row) for s in tqdm(shapes, desc="shapes", unit="shape")]
    return draft_row, rows


def pick_target(rows: list[Candidate], reference_params: int, max_ratio: float = 0.12,
                tolerance: float = 0.05, by: str = "op_ratio") -> Candidate:
    """The target shape by the module docstring's rule; `by` is "op_ratio" or "step_ratio" (measured)."""
    lo, hi = MLP_RATIO_RANGE
    ok = [r for r in rows if getattr(r, by) is not None and getattr(r, by) <= max_ratio
          and lo <= r.mlp_ratio <= hi and abs(r.params / reference_params - 1) <= tolerance]
    if not ok:
        raise AccheadError(f"no candidate shape has {by} <= {max_ratio} within {tolerance:.0%} of "
                           f"{reference_params:,} parameters; add depths (--depths)")
    return min(ok, key=lambda r: (r.shape.num_layers, abs(r.params - reference_params), -r.shape.hidden_size))


def markdown_table(draft_row: Candidate, rows: list[Candidate], picked: Candidate) -> str:
    """The table as markdown, the draft first and the pick in bold."""
    timed = draft_row.step_ms is not None
    head = "| shape | params | ops / step | non-view ops | op ratio | mlp / hidden |"
    head += " step ms | step ratio |" if timed else ""
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in [draft_row, *rows]:
        name = r.shape.label() + (" (draft)" if r is draft_row else "")
        cells = [name, f"{r.params / 1e6:.2f}M", str(r.ops), str(r.non_view_ops), f"{r.op_ratio:.3f}",
                 f"{r.mlp_ratio:.2f}"]
        if timed:
            cells += [f"{r.step_ms:.2f}", f"{r.step_ratio:.3f}"]
        if r is picked:
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def add_arch_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The shape-table flags (shared with `acchead-build-zoo --stage arch`)."""
    p.add_argument("--depths", type=_ints, default=DEFAULT_DEPTHS,
                   help=f"candidate layer counts (default: {','.join(map(str, DEFAULT_DEPTHS))})")
    p.add_argument("--widths", type=_ints, default=DEFAULT_WIDTHS,
                   help=f"candidate hidden sizes (default: {','.join(map(str, DEFAULT_WIDTHS))})")
    p.add_argument("--max-op-ratio", type=float, default=0.12,
                   help="draft/target ratio the pick must reach (default: 0.12, issue 21's goal)")
    p.add_argument("--param-tolerance", type=float, default=0.05,
                   help="allowed relative distance from today's target's parameter count (default: 0.05)")
    p.add_argument("--context", type=int, default=128,
                   help="KV-cache length before the counted step (default: 128)")
    p.add_argument("--time", action="store_true",
                   help="also measure each shape's eager one-token step (median of 50) and pick by the "
                        "measured step ratio when --arch-device is cuda")
    p.add_argument("--arch-device", default="cpu", help="device for --time: cpu or cuda (default: cpu)")
    p.add_argument("--arch-out", type=Path, default=None, help="also write the table as JSON here")


def run_arch(args: argparse.Namespace, draft: Shape, reference: Shape) -> Candidate:
    """Print the shape table and the pick; write it to `--arch-out` if given. Returns the pick."""
    if args.arch_device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise AccheadError("--arch-device cuda: no CUDA device here")
    elif args.arch_device != "cpu":
        raise AccheadError(f"--arch-device must be cpu or cuda, got {args.arch_device!r}")
    ref_params = llama_params(reference)
    draft_row, rows = candidate_table(draft, ref_params, args.depths, args.widths, args.context,
                                      args.time, args.arch_device)
    by = "step_ratio" if args.time and args.arch_device == "cuda" else "op_ratio"
    picked = pick_target(rows, ref_params, args.max_op_ratio, args.param_tolerance, by)
    print(markdown_table(draft_row, rows, picked))
    print(f"\npicked by {by}: {picked.shape.label()}, {picked.params:,} parameters "
          f"(reference {reference.label()}: {ref_params:,}), op ratio {picked.op_ratio:.3f}")
    if args.arch_out is not None:
        import torch

        atomic_write_json(args.arch_out, {
            "context": args.context, "picked_by": by, "max_ratio": args.max_op_ratio,
            "reference": {**asdict(reference), "params": ref_params},
            "draft": asdict(draft_row), "candidates": [asdict(r) for r in rows], "picked": asdict(picked),
            "device": args.arch_device, "threads": torch.get_num_threads(), "torch": torch.__version__,
        }, sort_keys=False)
    return picked
