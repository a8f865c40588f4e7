"""Command line and config of `acchead-bench`; the grid of settings they expand to is
`acchead.inference.bench.settings`.

Every flag has its default in `configs/bench.yaml` (or the file given by `--config`); a flag on the command
line overrides the file. `null` model paths mean the `--pair`'s models and shipped heads (`acchead.pairs`;
the default pair is the demo pair), resolved here at the command line: the decoders never pick a head.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from acchead.errors import AccheadError, thread_count
from acchead.inference.bench.settings import FAMILIES
from acchead.inference.policy_spec import ADAEDL_GAMMA
from acchead.inference.spec import PATHS, VERIFIERS
from acchead.pairs import PAIR_NAMES
from acchead.prompt_sets import list_prompt_sets
from acchead.sampling import SamplingConfig


def _float_list(text: str) -> list[float]:
    try:
        return [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _str_list(text: str, sep: str = ",") -> list[str]:
    return [x.strip() for x in str(text).split(sep) if x.strip()]


def _spec_list(text: str) -> list[str]:
    # Specs contain commas (specdecpp:h=0.8,max=20), so the list separator is ';'.
    return _str_list(text, ";")


def _shipped_defaults() -> dict[str, Any]:
    from acchead.configs import config_path
    from acchead.layered_config import read_mapping

    try:
        return read_mapping(config_path("bench"))
    except AccheadError:
        return {}  # --help must work even with a broken config; resolve_args reports it


def build_parser() -> argparse.ArgumentParser:
    shipped = _shipped_defaults()
    p = argparse.ArgumentParser(
        prog="acchead-bench",
        description="Benchmark autoregressive decoding, SpecDec (fixed K), SpecDec++ (head threshold h), the "
        "draft-confidence rule, the draft-entropy rule, AdaEDL (fixed and online lambda), the hindsight "
        "oracle and Hugging Face assisted generation on one prompt set; writes OUT/results.json, "
        "OUT/pareto.png and OUT/report.md.",
        epilog="Every flag defaults to its key in the config file (shown as [config: ...] for the shipped "
        "configs/bench.yaml); flags given on the command line override the file.",
    )

    def a(flag: str, **kw: Any) -> None:
        key = flag.lstrip("-").replace("-", "_")
        if key in shipped and "help" in kw:
            v = shipped[key]
            sep = ";" if key == "extra_specs" else ","
            shown = sep.join(map(str, v)) if isinstance(v, list) else "null" if v is None else v
            kw["help"] += f" [config: {shown}]"
        p.add_argument(flag, **kw)

    a("--config", default=None, help="YAML file with defaults for every flag (default: configs/bench.yaml)")
    a(
        "--prompts",
        help=f"prompt set name ({', '.join(list_prompt_sets())}) or a .jsonl file with a 'prompt' field",
    )
    a("--num-prompts", type=int, help="use the first N prompts (0 = all)")
    a("--max-new-tokens", type=int, help="tokens generated per prompt (EOS may end a prompt earlier)")
    a("--temperature", type=float, help="sampling temperature; 0 = greedy (the oracle needs greedy)")
    a("--top-k", type=int, help="keep the k most likely tokens when sampling (0 = off)")
    a("--top-p", type=float, help="nucleus sampling mass (1.0 = off)")
    a("--seed", type=int, help="base seed; prompt i is decoded with seed+i by every method")
    a("--out", help="output directory (partial results, results.json, pareto.png, report.md)")
    a("--pair", choices=PAIR_NAMES, help="the named pair whose models and heads are the defaults (toy)")
    a("--target", help="target model directory or .gguf file (default: the --pair's target)")
    a("--draft", help="draft model directory (default: the --pair's draft)")
    a("--tokenizer", help="tokenizer directory (default: the target's)")
    a(
        "--head",
        type=_str_list,
        help="SpecDec++ acceptance head files or directories, comma-separated; each runs the h-grid as its "
        "own method (specdecpp for a candidate head, specdecpp-lookahead for a lookahead head; default: "
        "every shipped head trained under the requested sampling configuration)",
    )
    a("--methods", type=_str_list, help=f"comma-separated subset of {', '.join(FAMILIES)}")
    a("--k-grid", type=_int_list, help="SpecDec candidate lengths K, comma-separated")
    a("--h-grid", type=_float_list, help="SpecDec++ stop thresholds h in (0, 1), comma-separated")
    a("--specdecpp-max", type=int, help="SpecDec++ cap on candidates per round")
    a("--specdecpp-rules", type=_str_list, help="SpecDec++ thresholds, comma-separated: paper (stop once P̂ < "
      "1 - h) and/or priced (1 - h plus the price of a wider verification, timed at the fast path's warm-up: "
      "the policy's priced=1); each runs the h-grid")  # fmt: skip
    a("--tau-grid", type=_float_list, help="confidence-rule thresholds tau in (0, 1), comma-separated")
    a("--entropy-tau-grid", type=_float_list, help="entropy-rule thresholds tau >= 0 in nats (stop after a "
      "candidate whose draft distribution has entropy > tau), comma-separated")  # fmt: skip
    a("--adaedl-lam-grid", type=_float_list, help="AdaEDL with fixed lambda in [0, 1] (stop when 1 - "
      "sqrt(gamma * H(q)) < lambda), comma-separated")  # fmt: skip
    a("--adaedl-adapt-grid", type=_float_list, help="AdaEDL with the paper's online lambda: initial lambda "
      "values in [0, 1], comma-separated (method adaedl-adapt)")  # fmt: skip
    a("--adaedl-gamma", type=float, help=f"AdaEDL's entropy factor gamma > 0 (the paper's {ADAEDL_GAMMA:g})")
    a(
        "--extra-specs",
        type=_spec_list,
        help="extra decoders run as method 'extra', ';'-separated: bandits "
        "(ucb:arms=specdec:k=2|specdec:k=4), or DRAFTER+POLICY with a model-free or cascaded drafter "
        "(mag+specdec:k=10, cascade:k=4.2/10+specdec:k=6), or copy rounds beside the draft model's "
        "(copy+specdecpp:h=0.9, copy:min=3,block=16+specdec:k=2)",
    )
    a("--verifier", choices=VERIFIERS, help="verification rule of our decoders")
    a(
        "--paths",
        type=_str_list,
        help="decoding paths of our draft-model decoders, comma-separated: eager (DynamicCache, eager "
        "forwards) and/or fast (static caches, forwards compiled once per shape; CUDA graphs on a GPU). "
        "Fast-path rows are reported as families NAME@fast with their own fitted t_draft/t_target, beside "
        "hf-generate and hf-assisted",
    )
    a(
        "--cost-ratios",
        type=_float_list,
        help="declared draft/target forward-cost ratios c = t_draft/t_target, comma-separated: every row is "
        "also priced at each (speedup over autoregressive = N / (c*N_draft + N_target)), beside the fitted "
        "costs, which a CPU fit does not transfer to GPUs (0.2: the paper's 7B/70B on A100)",
    )
    a("--plot-ratio", type=float, help="also plot the modelled speedup at this cost ratio in pareto.png")
    a("--device", help="torch device for both models (cpu, cuda)")
    a("--dtype", help="model dtype (float32, bfloat16, float16)")
    a("--threads", type=thread_count, help="torch CPU threads (0 = torch's default)")
    a("--batch-size", type=_int_list, help="also decode the autoregressive, specdec and specdecpp settings B "
      "prompts at a time for each B, e.g. 1,4,16,64 (acchead.inference.batched; report: a row per B)")
    a("--batch-stop", type=_str_list, help="with --batch-size: the batch stop rules of the batched specdecpp "
      "rows, comma-separated, a row each: on (c = 1 - h), measured (c(B) timed on this machine), gated "
      "(measured, and the round gate: draft a round only while drafting finishes the batch sooner), off, "
      "or a ratio c (default gated: never more than 2%% behind measured and up to half ahead of it in "
      "docs/batched.md; rows with copy rounds run measured in its place)")
    a("--overhead-calls", type=int, help="timed calls for the head-overhead medians")
    a(
        "--loop-profile-prompts",
        type=int,
        help="prompts of the decoding-loop profile (draft step and verification inside the decoder vs a bare "
        "replay, host reads per round; a fixed-K and a SpecDec++ setting per path); 0 = off",
    )
    a("--fresh", action="store_true", default=None, help="ignore partial results in OUT and rerun everything")
    a(
        "--overwrite",
        action="store_true",
        default=None,
        help="replace OUT even if it holds another run (a bench with other settings, gen-data, training)",
    )
    a(
        "--truncate-prompts",
        action="store_true",
        default=None,
        help="keep the last tokens of prompts too long for the context (recorded in results.json); "
        "default: refuse them",
    )
    return p


def _converted(path: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """A config file's values as the flags' parsers would produce them (`_from_yaml`)."""
    return {k: _from_yaml(path, k, v) for k, v in cfg.items() if v is not None}


def resolve_args(args: argparse.Namespace) -> argparse.Namespace:
    """Fill every flag left unset from `--config`, then the shipped config, then the demo pair; validate.

    A user config may set only some keys; the others keep the shipped defaults (`acchead.layered_config`).
    The config's `goals:` section (not flags) becomes `args.goals`, a `GoalThresholds`.
    """
    from acchead.configs import config_path
    from acchead.inference.bench.thresholds import GoalThresholds
    from acchead.layered_config import resolve_layers

    flags = {k: v for k, v in vars(args).items() if k != "config"}
    merged = resolve_layers(config_path("bench"), args.config, flags, {*flags, "goals"}, convert=_converted)
    for k in flags:
        setattr(args, k, merged.get(k))
    args.goals = GoalThresholds.from_mapping(merged.get("goals") or {}, "config goals")
    _apply_demo_defaults(args)
    _validate(args)
    return args


_LISTS = {"methods": _str_list, "paths": _str_list, "k_grid": _int_list, "h_grid": _float_list,
          "tau_grid": _float_list, "entropy_tau_grid": _float_list, "adaedl_lam_grid": _float_list,
          "adaedl_adapt_grid": _float_list,
          "cost_ratios": _float_list, "extra_specs": _spec_list, "head": _str_list,
          "batch_stop": _str_list, "specdecpp_rules": _str_list, "batch_size": _int_list}  # fmt: skip
_INTS = {"num_prompts", "max_new_tokens", "top_k", "seed", "specdecpp_max", "threads", "overhead_calls",
         "loop_profile_prompts"}  # fmt: skip
_FLOATS = {"temperature", "top_p", "adaedl_gamma", "plot_ratio"}
_STRS = {"prompts", "out", "target", "draft", "tokenizer", "device", "dtype", "pair", "verifier"}


def _from_yaml(path: Path, key: str, value: Any) -> Any:
    """A config value converted to what the flag's parser would produce (one-line error if impossible)."""
    try:
        if key in _LISTS:
            parse = _LISTS[key]
            items = value if isinstance(value, list) else [value]
            return [x for item in items for x in parse(str(item))]
        if key in _INTS and not (isinstance(value, int) and not isinstance(value, bool)):
            raise TypeError
        if key == "threads":
            return thread_count(str(value))  # the flag's bound: >= 0
        if key in _STRS and not isinstance(value, str):
            raise TypeError
        if key in _FLOATS:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError
            return float(value)
        if key in ("fresh", "overwrite", "truncate_prompts") and not isinstance(value, bool):
            raise TypeError
    except (TypeError, argparse.ArgumentTypeError):
        raise AccheadError(f"{path}: bad value for {key}: {value!r}") from None
    return value


def _apply_demo_defaults(args: argparse.Namespace) -> None:
    from acchead.pairs import default_heads, resolve_pair

    pair = resolve_pair(args.pair, args.target, args.draft)
    args.pair, args.target, args.draft = pair.name, pair.target, pair.draft
    if not args.head:  # every shipped head of the pair trained under S, its default first
        try:
            sampling = SamplingConfig(args.temperature or 0.0, args.top_k or 0, args.top_p or 1.0)
        except ValueError as e:
            raise AccheadError(str(e)) from None
        args.head = [str(p) for p in default_heads(args.pair, sampling)]
    args.fresh = bool(args.fresh)
    args.overwrite = bool(args.overwrite)
    args.truncate_prompts = bool(args.truncate_prompts)
    defaults = {"extra_specs": [], "threads": 0, "verifier": "token", "num_prompts": 0,
                "adaedl_gamma": ADAEDL_GAMMA, "cost_ratios": [], "batch_stop": ["gated"]}  # fmt: skip
    if args.paths is None:  # the fast path is the decoders' default on CUDA; on the CPU it is opt-in
        args.paths = ["eager", "fast"] if str(args.device or "cpu").startswith("cuda") else ["eager"]
    for k, default in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, default)


def _validate(args: argparse.Namespace) -> None:
    required = (
        "prompts",
        "max_new_tokens",
        "temperature",
        "top_k",
        "top_p",
        "seed",
        "out",
        "methods",
        "device",
        "dtype",
        "overhead_calls",
        "loop_profile_prompts",
    )
    missing = [k for k in required if getattr(args, k) is None]
    if missing:
        raise AccheadError(f"no value for {', '.join('--' + k.replace('_', '-') for k in missing)}")
    bad = [m for m in args.methods if m not in FAMILIES]
    if bad:
        raise AccheadError(f"unknown method {bad[0]!r}; choose from {', '.join(FAMILIES)}")
    if not args.specdecpp_rules or not set(args.specdecpp_rules) <= {"paper", "priced"}:
        got = ",".join(args.specdecpp_rules)
        raise AccheadError(f"--specdecpp-rules takes paper and/or priced, got {got or 'nothing'}")
    bad = [x for x in args.paths if x not in PATHS]
    if bad or not args.paths:
        raise AccheadError(f"--paths takes {' and/or '.join(PATHS)}, got {','.join(args.paths) or 'nothing'}")
    if args.max_new_tokens < 1:
        raise AccheadError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.num_prompts < 0:
        raise AccheadError(f"--num-prompts must be >= 0, got {args.num_prompts}")
    if args.overhead_calls < 1:
        raise AccheadError(f"--overhead-calls must be >= 1, got {args.overhead_calls}")
    if args.loop_profile_prompts < 0:
        raise AccheadError(f"--loop-profile-prompts must be >= 0, got {args.loop_profile_prompts}")
    try:
        SamplingConfig(args.temperature, args.top_k, args.top_p)
    except ValueError as e:
        raise AccheadError(str(e)) from None
    if "specdec" in args.methods and any(k < 1 for k in args.k_grid or [0]):
        raise AccheadError(f"--k-grid needs K >= 1, got {args.k_grid}")
    if "specdecpp" in args.methods and any(not 0 < h < 1 for h in args.h_grid or [0]):
        raise AccheadError(f"--h-grid needs thresholds in (0, 1), got {args.h_grid}")
    if "confidence" in args.methods and any(not 0 < t < 1 for t in args.tau_grid or [0]):
        raise AccheadError(f"--tau-grid needs thresholds in (0, 1), got {args.tau_grid}")
    if "entropy" in args.methods and any(not 0 <= t < math.inf for t in args.entropy_tau_grid or [-1]):
        grid = args.entropy_tau_grid
        raise AccheadError(f"--entropy-tau-grid needs finite thresholds >= 0 (nats), got {grid}")
    for method, flag, grid in (("adaedl", "--adaedl-lam-grid", args.adaedl_lam_grid),
                               ("adaedl-adapt", "--adaedl-adapt-grid", args.adaedl_adapt_grid)):  # fmt: skip
        if method in args.methods and any(not 0 <= lam <= 1 for lam in grid or [-1]):
            raise AccheadError(f"{flag} needs lambda values in [0, 1], got {grid}")
    if not 0 < args.adaedl_gamma < math.inf:
        raise AccheadError(f"--adaedl-gamma must be > 0, got {args.adaedl_gamma}")
    if any(not 0 <= c < math.inf for c in args.cost_ratios):
        raise AccheadError(f"--cost-ratios needs finite ratios >= 0, got {args.cost_ratios}")
    if any(b < 1 for b in args.batch_size or []):
        raise AccheadError(f"--batch-size needs B >= 1, got {','.join(map(str, args.batch_size))}")
    if args.batch_stop:
        from acchead.inference.batch_stop import parse_batch_stop

        for rule in args.batch_stop:
            parse_batch_stop(rule, 0.5)  # a bad rule is one line before any model loads
    if args.plot_ratio is not None and not 0 <= args.plot_ratio < math.inf:
        raise AccheadError(f"--plot-ratio must be a finite ratio >= 0, got {args.plot_ratio}")
