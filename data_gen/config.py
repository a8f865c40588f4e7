"""Command line and YAML config of `acchead-gen-data`.

Every flag has its default in `configs/gen_data.yaml`; a `--config` file overrides the keys it sets and a
flag given on the command line overrides both (`acchead.layered_config`). The prompt source is one of
`--prompt-set`, `--prompts FILE`, `--dataset NAME`, or responses generated elsewhere, `--responses FILE`:
one given on the command line (or in the `--config` file) replaces the shipped file's choice.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from acchead.data_gen.placement import parse_process_gpus
from acchead.data_gen.prompts import PromptSource
from acchead.data_gen.responses import ResponsesSource
from acchead.errors import AccheadError
from acchead.layered_config import read_mapping, resolve_layers
from acchead.pairs import DEFAULT_PAIR, PAIR_NAMES
from acchead.prompt_sets import list_prompt_sets
from acchead.rundir import refuse_out_holding
from acchead.sampling import SamplingConfig

SOURCE_KEYS = ("prompt_set", "prompts", "dataset", "responses")
# The YAML types of configs/gen_data.yaml's keys (`acchead.layered_config.check_types`); others: strings.
ACCEPTED: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(("max_new_tokens", "num_prompts", "top_k", "feature_chain", "seed", "batch_size",
                     "shard_size"), (int,)),
    **dict.fromkeys(("temperature", "top_p", "flush_seconds"), (float,)),
    **dict.fromkeys(("chat_template", "overwrite"), (bool,)),
    "mix_ratio": (str, float), "cache_features": (str, bool), "device_map": (str, dict),
    "process_gpus": (str, int),
}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="acchead-gen-data",
        description="Label every response position of target samples with its exact acceptance probability "
        "under the decoding configuration S (DESIGN §2): the target samples X, the draft proposes Y_i ~ q_i, "
        "label min(1, p_i(Y_i)/q_i(Y_i)); Z mixes X (prob. r) and Y. Writes a `datasets` dataset to --out, "
        "resumable (rerun the same command) and spreadable with `accelerate launch`. With --responses, X "
        "comes from a serving engine instead and both models run teacher-forced over prompt + X.",
        epilog="Defaults in [brackets] come from configs/gen_data.yaml; a flag overrides its key. Draft and "
        "target must share one tokenizer (the same token->id map and EOS id). Prompts too long for "
        "len(prompt) + max_new_tokens <= context are skipped and counted; empty prompts are refused. "
        "Several processes: accelerate launch [--num_processes N] -m acchead.data_gen.cli [flags]; with "
        "--device-map each process shards its own target over its share of the GPUs. docs/gen-data.md has "
        "the --responses format.",
    )
    a = p.add_argument
    a("--config", default=None, help="YAML with defaults for every flag (default: configs/gen_data.yaml)")
    g = p.add_argument_group("models")
    g.add_argument("--pair", choices=PAIR_NAMES, help="named pair whose models are the defaults (toy)")
    g.add_argument("--target", help="target model: HF directory, .gguf file or hub id (default: the pair's)")
    g.add_argument("--draft", help="draft model: HF directory or hub id (default: the pair's)")
    g.add_argument(
        "--dtype", help="model dtype: float32, bfloat16 or float16 (probabilities are float32 anyway)"
    )
    g.add_argument(
        "--device", help="device for both models, e.g. cpu, cuda:0 (default: accelerate's per-process one)"
    )
    g.add_argument(
        "--device-map",
        help="shard the target over GPUs with this transformers device_map, e.g. auto; with N processes "
        "on a node of G GPUs, process r shards it over GPUs r*G/N..(r+1)*G/N-1 (N must divide G) and puts "
        "the draft on the first of them",
    )
    g.add_argument(
        "--process-gpus",
        help="with --device-map: each process's GPUs instead, ',' within a process and ';' between "
        "processes in local-rank order, e.g. '0,1,2;3,4,5'",
    )
    g = p.add_argument_group("prompts (one source: a prompt set, a file, a dataset, or --responses)")
    g.add_argument("--prompt-set", help=f"built-in prompt set: {', '.join(list_prompt_sets())}")
    g.add_argument(
        "--prompts", help="prompt file: .jsonl, .json, .parquet (field --prompt-field) or .txt (a line each)"
    )
    g.add_argument(
        "--dataset", help="`datasets` dataset: a save_to_disk directory or a name in the local HF cache"
    )
    g.add_argument(
        "--responses",
        help="label responses generated elsewhere (a serving engine) instead of sampling the target: .jsonl "
        "or `datasets` directory, fields prompt or prompt_ids, response or response_ids, optional "
        "prompt_index; give the engine's sampling settings as S and its max_tokens as --max-new-tokens. "
        "Responses that are empty, do not round-trip the tokenizer, hold an EOS before their end, or are too "
        "long are skipped and counted",
    )
    g.add_argument("--dataset-split", help="split of --dataset (or of a --responses dataset with splits)")
    g.add_argument("--prompt-field", help="field/column holding the prompt text in --prompts or --dataset")
    g.add_argument(
        "--chat-template",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="wrap each text prompt as a user turn with the target tokenizer's chat template",
    )
    g.add_argument("--num-prompts", type=int, help="use the first N prompts or responses (0 = all)")
    g = p.add_argument_group(
        "sampling configuration S (the decoder's; applied temperature -> top-k -> top-p)"
    )
    g.add_argument("--temperature", type=float, help="0 = greedy")
    g.add_argument("--top-k", type=int, help="keep the k most likely tokens (0 = off)")
    g.add_argument("--top-p", type=float, help="nucleus mass (1.0 = off)")
    g = p.add_argument_group("labelling")
    g.add_argument(
        "--max-new-tokens",
        type=int,
        help="response length cap; EOS ends a response earlier (kept); with --responses, longer responses "
        "are skipped",
    )
    g.add_argument(
        "--mix-ratio",
        help="probability r that Z_i is the target's X_i rather than Y_i, or 'auto': the measured best per "
        f"S for the default lookahead head ({', '.join(f'{k} {v:g}' for k, v in DEFAULT_MIX_RATIO.items())}; "
        "docs/heads.md); a candidate (paper's) head needs r < 1, e.g. 0.15",
    )
    g.add_argument(
        "--feature-chain",
        type=int,
        help="feature (EAGLE) drafts: label a round's first N candidates, position j as the candidate of "
        "depth j mod N, which reads the draft's own states as decoding does (acchead.feature_chain); "
        "1 = first candidates only (every state the target's); ignored for other drafts",
    )
    g.add_argument("--seed", type=int, help="run seed; prompt i's random streams derive from (seed, i)")
    g.add_argument(
        "--cache-features",
        choices=("auto", "on", "off"),
        help="store the draft's float16 hidden states for training; auto = on if estimated <= 4 GiB",
    )
    g = p.add_argument_group("execution")
    g.add_argument(
        "--batch-size", type=int, help="prompts per batch (part of the run's identity: it sets rounding)"
    )
    g.add_argument(
        "--shard-size",
        type=int,
        help="write labelled rows to disk after at most this many prompts (the most a kill can lose)",
    )
    g.add_argument(
        "--flush-seconds",
        type=float,
        help="... or after this many seconds, whichever comes first (neither flag changes the data)",
    )
    g.add_argument("--out", help="output directory; rerunning the same command resumes an unfinished run")
    g.add_argument(
        "--emit-responses",
        help="when the run is complete, also write its target responses to this .jsonl in the --responses "
        "format (prompt_index, prompt_ids, response_ids): a check of labels from responses",
    )
    g.add_argument(
        "--overwrite",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="replace --out even if it holds another run (without: such an OUT is refused)",
    )
    _show_defaults(p)
    return p


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Append each flag's value in the shipped YAML to its help (argparse's own defaults are all None)."""
    from acchead.configs import config_path

    try:
        defaults = read_mapping(config_path("gen_data"))
    except AccheadError:
        return  # --help must work even with a broken config; parse_args reports it
    for action in parser._actions:
        if action.help and defaults.get(action.dest) is not None:
            action.help += f" [{defaults[action.dest]}]"


# r chosen per S by measurement for the default (lookahead) head (docs/heads.md, "Mixing ratio"): under
# greedy decoding a candidate only matters when every earlier candidate was accepted, i.e. equal to the
# target's token, so contexts of target tokens (r = 1) match what the decoder conditions on. Under sampling
# the first round (1,500 prompts) could not order r = 0.15 and r = 1; the shipped T = 1 / top-k 50 head was
# trained at r = 1 and beat the r = 0.15 head it replaced. A candidate head needs r < 1 (`--mix-ratio 0.15`).
DEFAULT_MIX_RATIO = {"greedy": 1.0, "sampling": 1.0}


def resolve_mix_ratio(value: object, sampling: SamplingConfig) -> float:
    """`value` as a float, or the per-S default for "auto"/None; AccheadError if neither."""
    if value is None or str(value).strip().lower() == "auto":
        return DEFAULT_MIX_RATIO["greedy" if sampling.greedy else "sampling"]
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise AccheadError(f"--mix-ratio must be a number in [0, 1] or 'auto', got {value!r}") from None


@dataclass(frozen=True)
class GenDataArgs:
    """Validated settings of one run (flags merged over the YAML)."""

    target: str | None
    draft: str | None
    dtype: str
    device: str | None
    device_map: str | None
    source: PromptSource | ResponsesSource
    chat_template: bool
    num_prompts: int
    sampling: SamplingConfig
    max_new_tokens: int
    mix_ratio: float
    seed: int
    cache_features: str
    batch_size: int
    shard_size: int
    out: Path
    flush_seconds: float = 60.0
    overwrite: bool = False
    process_gpus: list[list[int]] | None = None
    emit_responses: Path | None = None
    pair: str = DEFAULT_PAIR  # whose models `target` / `draft` default to (acchead.pairs)
    feature_chain: int = 1  # a feature draft's candidates labelled per round (TargetFedDraft's levels)

    @property
    def from_responses(self) -> bool:
        """Labels for responses generated elsewhere (`--responses`) rather than the target's own samples."""
        return isinstance(self.source, ResponsesSource)


def parse_args(argv: list[str] | None = None) -> GenDataArgs:
    """Flags over YAML defaults -> validated `GenDataArgs`."""
    from acchead.configs import config_path

    parser = build_parser()
    ns = parser.parse_args(argv)
    flags = {k: v for k, v in vars(ns).items() if k != "config"}
    # One prompt source: a file or the command line naming one replaces the layers' source below it.
    accepted = {**dict.fromkeys(flags, (str,)), **ACCEPTED}
    merged = resolve_layers(config_path("gen_data"), ns.config, flags, set(flags), exclusive=[SOURCE_KEYS],
                            accepted=accepted)  # fmt: skip
    get = merged.get

    sources = [k for k in SOURCE_KEYS if get(k)]
    if len(sources) != 1:
        given = f": {', '.join('--' + k.replace('_', '-') for k in sources)}" if sources else ""
        raise AccheadError(
            "give exactly one source of prompts (--prompt-set, --prompts, --dataset) or of responses "
            f"(--responses), got {len(sources)}{given}"
        )
    split = str(get("dataset_split") or "train")
    source: PromptSource | ResponsesSource
    if sources[0] == "responses":
        source = ResponsesSource(str(get("responses")), split=split)
        if get("emit_responses"):
            raise AccheadError(
                "--emit-responses writes the target's own responses; with --responses they are the input"
            )
    else:
        field = str(get("prompt_field") or "prompt")
        kind = {"prompt_set": "builtin", "prompts": "file", "dataset": "dataset"}[sources[0]]
        source = PromptSource(kind, str(get(sources[0])), field=field, split=split)

    try:
        sampling = SamplingConfig(
            float(get("temperature", 1.0)), int(get("top_k", 0)), float(get("top_p", 1.0))
        )
    except ValueError as e:
        raise AccheadError(str(e)) from e
    mix_ratio = resolve_mix_ratio(get("mix_ratio", "auto"), sampling)
    checks = {
        "max_new_tokens": int(get("max_new_tokens", 128)) >= 1,
        "batch_size": int(get("batch_size", 16)) >= 1,
        "shard_size": int(get("shard_size", 256)) >= 1,
        "flush_seconds": float(get("flush_seconds", 60.0)) >= 0,
        "num_prompts": int(get("num_prompts") or 0) >= 0,
        "mix_ratio": 0.0 <= mix_ratio <= 1.0,
        "feature_chain": int(get("feature_chain", 1)) >= 1,
    }
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        raise AccheadError(f"out of range: {', '.join(f'{k}={get(k)}' for k in bad)}")
    cache = str(get("cache_features", "auto")).lower()
    cache = {"true": "on", "false": "off"}.get(cache, cache)  # YAML booleans
    if cache not in ("auto", "on", "off"):
        raise AccheadError(f"cache_features must be auto, on or off, got {get('cache_features')!r}")
    if not get("out"):
        raise AccheadError("no output directory: give --out")
    inputs = ("prompts", "dataset", "responses", "target", "draft")
    refuse_out_holding(str(get("out")), **{k: get(k) for k in inputs})  # --overwrite would delete them
    emit = Path(str(get("emit_responses"))).expanduser() if get("emit_responses") else None
    if emit is not None and (emit.is_dir() or not emit.parent.is_dir()):
        raise AccheadError(f"--emit-responses {emit}: give a file path in an existing directory")
    pair = get("pair") or DEFAULT_PAIR
    if pair not in PAIR_NAMES:
        raise AccheadError(f"unknown pair {pair!r}; choose one of {', '.join(PAIR_NAMES)}")
    return GenDataArgs(
        pair=pair,
        target=get("target"),
        draft=get("draft"),
        dtype=str(get("dtype") or "float32"),
        device=get("device"),
        device_map=get("device_map"),
        source=source,
        chat_template=bool(get("chat_template", False)),
        num_prompts=int(get("num_prompts") or 0),
        sampling=sampling,
        max_new_tokens=int(get("max_new_tokens", 128)),
        mix_ratio=mix_ratio,
        feature_chain=int(get("feature_chain", 1)),
        seed=int(get("seed", 0)),
        cache_features=cache,
        batch_size=int(get("batch_size", 16)),
        shard_size=int(get("shard_size", 256)),
        out=Path(str(get("out"))).expanduser(),
        flush_seconds=float(get("flush_seconds", 60.0)),
        overwrite=bool(get("overwrite", False)),
        process_gpus=parse_process_gpus(str(get("process_gpus"))) if get("process_gpus") else None,
        emit_responses=emit,
    )
