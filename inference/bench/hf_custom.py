"""Our decoder called through transformers' `generate` (`custom_generate=acchead.inference.hf.generate`):
the bench's `hf-custom` row, and the measurement of what that wrapper costs.

The `hf-custom` row decodes one of the bench's own settings (its "twin": SpecDec++ h = 0.8 of the first
head when the grid has it; see `acchead.inference.bench.config.hf_custom_setting`) through `generate`, so
its wall clock beside the twin's is the wrapper's overhead; its counts are the decoder's own.

    python -m acchead.inference.bench.hf_custom --num-prompts 10 --max-new-tokens 64 --repeats 3

times, on the demo pair, greedy, 1 torch thread, after a warm-up, our decoder's `generate` and the same
decoder object reached through `target.generate(..., custom_generate=...)` on the same prompts, alternating
which goes first, and prints both tokens/s and their ratio, over all calls and over each prompt's fastest
call of each way (the figure a neighbour's load on a shared machine disturbs least; the goal, ≤ 5% fewer
tokens/s through generate, is judged on it), and `generate`'s own preparation time per call.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from acchead.errors import cli_errors, thread_count
from acchead.inference.bench.hf_assisted import sampling_kwargs
from acchead.inference.bench.thresholds import GoalThresholds
from acchead.inference.spec import DecodingSpec
from acchead.sampling import SamplingConfig

METHOD = "hf-custom"


@dataclass
class CustomResult:
    """One decode through `generate`; the stat names of `SpeculativeDecoder.generate`'s result.

    Attributes:
        new_ids: (N,) int64 generated ids on the CPU (prompt excluded).
        wall_time: seconds spent in `target.generate`, wrapper included.
    """

    new_ids: torch.Tensor
    tokens: int
    target_calls: int
    draft_calls: int
    discarded: int
    wall_time: float


def hf_custom_generate(
    target: Any,
    draft: Any,
    input_ids: torch.Tensor,
    *,
    spec: DecodingSpec | str,
    max_new_tokens: int,
    sampling: SamplingConfig,
    seed: int,
    eos_token_id: int | None = None,
) -> CustomResult:
    """Decode `input_ids` ((1, T)) as `spec` says through `target.generate(custom_generate=...)` (its path
    None: the device's default)."""
    from acchead.inference import hf

    start = time.perf_counter()
    out = target.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        draft=draft,
        custom_generate=hf.generate,
        spec=spec,
        seed=seed,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        return_dict_in_generate=True,
        **sampling_kwargs(sampling),
    )
    wall = time.perf_counter() - start
    new_ids = out.sequences[0, input_ids.shape[1] :].cpu()
    return CustomResult(
        new_ids=new_ids,
        tokens=int(new_ids.numel()),
        target_calls=int(out.target_calls),
        draft_calls=int(out.draft_calls),
        discarded=int(out.discarded),
        wall_time=wall,
    )


def measure_overhead(
    target: Any,
    draft: Any,
    prompts: list[torch.Tensor],
    *,
    policy: str,
    head: str | Path | None,
    max_new_tokens: int,
    repeats: int,
    eos_token_id: int | None,
) -> dict[str, float]:
    """Greedy tokens/s of the decoder called directly and through `generate`, on the same prompts.

    Both calls reach the same `SpeculativeDecoder` object (`hf.decoder_for`), so only the wrapper differs;
    each prompt runs both ways `repeats` times, alternating which goes first so that a slow drift of the
    machine's load falls on both. Both are timed from outside the call. Asserts equal outputs.

    Returns tokens/s and their ratio over all calls ("ratio"), and from each prompt's fastest call of
    each way ("min_ratio": what a neighbour's load on a shared machine disturbs least), the mean extra
    milliseconds per call, the ratio of this process's CPU time ("cpu_ratio": blind to other processes'
    load) and `generate`'s own preparation time per call.
    """
    from acchead.inference import hf
    from acchead.inference.spec import spec_arguments

    spec = DecodingSpec.from_spec(policy, head=None if head is None else str(head))
    policy_spec, head_path, verifier, fast = spec_arguments(spec, None, None, None, None)
    decoder = hf.decoder_for(target, draft, policy_spec, head_path, verifier, fast)  # what generate reaches
    # generate falls back on the model's EOS ids when given None: the direct call must stop where it does
    eos = target.generation_config.eos_token_id if eos_token_id is None else eos_token_id

    def direct(ids: torch.Tensor) -> list[int]:
        res = decoder.generate(ids, max_new_tokens=max_new_tokens, temperature=0.0, eos_token_id=eos)
        return res.new_ids.tolist()

    def through(ids: torch.Tensor) -> list[int]:
        res = hf_custom_generate(target, draft, ids, spec=spec, max_new_tokens=max_new_tokens,
                                 sampling=SamplingConfig(0.0), seed=0, eos_token_id=eos_token_id)  # fmt: skip
        return res.new_ids.tolist()

    direct(prompts[0]), through(prompts[0])  # warm-up: first calls build caches and look heads up
    ways = {"direct": direct, "generate": through}
    times: dict[str, list[list[float]]] = {name: [[] for _ in prompts] for name in ways}
    cpu = dict.fromkeys(ways, 0.0)  # this process's CPU seconds: what other processes' load leaves alone
    lengths = []
    for r in range(repeats):
        for i, ids in enumerate(prompts):
            outs = {}
            for name in ("direct", "generate") if (r + i) % 2 == 0 else ("generate", "direct"):
                start, start_cpu = time.perf_counter(), time.process_time()
                outs[name] = ways[name](ids)
                times[name][i].append(time.perf_counter() - start)
                cpu[name] += time.process_time() - start_cpu
            if outs["direct"] != outs["generate"]:
                raise AssertionError(f"prompt {i}: the two calls decoded different tokens")
            if r == 0:
                lengths.append(len(outs["direct"]))
    tokens = sum(lengths)
    total = {name: sum(map(sum, t)) for name, t in times.items()}
    fastest = {name: sum(map(min, t)) for name, t in times.items()}
    calls = repeats * len(prompts)
    return {
        "tokens": tokens * repeats,
        "calls": calls,
        "direct_tokens_per_s": tokens * repeats / total["direct"],
        "generate_tokens_per_s": tokens * repeats / total["generate"],
        "ratio": total["direct"] / total["generate"],
        "min_direct_tokens_per_s": tokens / fastest["direct"],
        "min_generate_tokens_per_s": tokens / fastest["generate"],
        "min_ratio": fastest["direct"] / fastest["generate"],
        "overhead_ms_per_call": (total["generate"] - total["direct"]) / calls * 1e3,
        "cpu_ratio": cpu["direct"] / cpu["generate"],
        "preparation_ms_per_call": _preparation_ms(target, draft, prompts[0], max_new_tokens),
    }


def _preparation_ms(
    target: Any, draft: Any, ids: torch.Tensor, max_new_tokens: int, calls: int = 50
) -> float:
    """Milliseconds `generate` spends before it calls the loop (a loop that returns at once): the part of
    the wrapper's cost that the side-by-side timing resolves only as noise."""

    def loop(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
        return input_ids

    kw = dict(attention_mask=torch.ones_like(ids), custom_generate=loop, max_new_tokens=max_new_tokens,
              do_sample=False)  # fmt: skip
    target.generate(ids, **kw)
    start = time.perf_counter()
    for _ in range(calls):
        target.generate(ids, **kw)
    return (time.perf_counter() - start) / calls * 1e3


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m acchead.inference.bench.hf_custom",
        description="Greedy tokens/s of our decoder called directly vs through transformers' generate "
        "(custom_generate), side by side on the same prompts (default: the demo pair, 1 thread).",
    )
    p.add_argument("--target", default=None, help="target model directory (default: the demo target)")
    p.add_argument("--draft", default=None, help="draft model directory (default: the demo draft)")
    p.add_argument("--head", default=None, help="head file (default: the demo pair's shipped greedy head)")
    p.add_argument("--policy", default="specdecpp", help="policy spec (default: specdecpp, the head's h)")
    p.add_argument("--prompts", default="humaneval", help="prompt set name or .jsonl file")
    p.add_argument("--num-prompts", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="timed passes over the prompts")
    p.add_argument("--threads", type=thread_count, default=1, help="torch CPU threads (0 = torch's default)")
    return p


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    from acchead import demo_pair
    from acchead.inference.spec import needs_head
    from acchead.models import load_causal_lm, load_tokenizer
    from acchead.prompt_sources import load_prompts

    hf_logging.set_verbosity_error()
    texts = load_prompts(args.prompts, args.num_prompts)  # a bad prompt set fails before any model loads
    target = load_causal_lm(args.target or demo_pair.TARGET_DIR)
    draft = load_causal_lm(args.draft or demo_pair.DRAFT_DIR)
    tok = load_tokenizer(args.target or demo_pair.TARGET_DIR)
    if args.head is None and needs_head(args.policy):  # resolved here: the decoder never picks a head
        args.head = str(demo_pair.head_for(SamplingConfig(0.0)))
    prompts = [tok(t, return_tensors="pt", add_special_tokens=False).input_ids for t in texts]
    m = measure_overhead(target, draft, prompts, policy=args.policy, head=args.head,
                         max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                         eos_token_id=tok.eos_token_id)  # fmt: skip
    print(f"{m['calls']} calls, {m['tokens']} tokens each way, {torch.get_num_threads()} thread(s)")
    print(f"all calls:        direct {m['direct_tokens_per_s']:.1f} tokens/s, through generate "
          f"{m['generate_tokens_per_s']:.1f} tokens/s: ratio {m['ratio']:.3f} "
          f"({m['overhead_ms_per_call']:+.2f} ms per call)")  # fmt: skip
    print(f"fastest per prompt: direct {m['min_direct_tokens_per_s']:.1f} tokens/s, through generate "
          f"{m['min_generate_tokens_per_s']:.1f} tokens/s: ratio {m['min_ratio']:.3f}")  # fmt: skip
    print(f"CPU time:         ratio {m['cpu_ratio']:.3f}")
    print(f"generate's preparation alone: {m['preparation_ms_per_call']:.2f} ms per call")
    need = GoalThresholds.shipped().generate_wrapper_min  # configs/bench.yaml, goals
    verdict = "met" if m["min_ratio"] >= need else "NOT met"
    print(f"goal: through generate ≥ {need:.2f}× direct (fastest per prompt): {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
