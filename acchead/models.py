"""Loading the draft/target LMs and tokenizers, checking that they fit together, and naming a draft.

Everything that reads a model from disk goes through `load_causal_lm` / `load_tokenizer`, so a missing path
or a directory that holds no model is one `AccheadError` line, not a transformers traceback.
`model_identity` is what a head records about the draft it was trained on; `final_hidden` is the one
place that decides which hidden state the head reads; `CACHE_ARG` (from `acchead.cache_keyword`) the one
place that names the keyword a forward takes its KV cache by.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

# re-exported: the keyword a forward takes its cache by (a module of its own: the drafts below use it too)
from acchead.cache_keyword import CACHE_ARG as CACHE_ARG
from acchead.errors import AccheadError
from acchead.feature_draft import register_auto_classes as register_feature_draft
from acchead.reduced_vocab import register_auto_classes

register_auto_classes()  # a reduced-vocabulary draft directory loads like any other
register_feature_draft()  # and so does a feature (EAGLE) draft

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}

# Elements of the input embedding sampled for the fingerprint: enough that two independently trained or
# initialised models collide with probability ~2^-8192, few enough that a 7B model's sample is instant.
_FINGERPRINT_SAMPLES = 8192
# Config fields that fix the shape of a causal LM; absent ones hash as null.
_SHAPE_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "tie_word_embeddings",
)


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """`"float32" | "fp16" | "bf16" | ...` or a torch dtype -> torch dtype (AccheadError if unknown)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype.lower()]
    except KeyError:
        raise AccheadError(f"unknown dtype {dtype!r}; choose one of {', '.join(_DTYPES)}") from None


def _looks_local(path_or_id: str | Path) -> bool:
    """True for anything that must be a local directory (not a hub id such as "org/name").

    Decided on the text, not the type: CLIs parse paths with `type=Path`, and "org/name" must still work.
    """
    s = str(path_or_id)
    if s.startswith((".", "/", "~")) or s.count("/") > 1:
        return True
    return Path(s).exists()


def _check_model_dir(path_or_id: str | Path, needs: tuple[str, ...], what: str) -> dict[str, Any]:
    """One-line error for a local path that is missing or holds none of the files in `needs`.

    A name that is not a local path is a hub id (`_check_hub_id`). Returns extra `from_pretrained`
    keyword arguments (`local_files_only` for a cached hub model while the hub is unreachable).
    """
    if not _looks_local(path_or_id):
        return _check_hub_id(str(path_or_id), needs, what)
    path = Path(path_or_id).expanduser()
    if not path.exists():
        raise AccheadError(f"{what} path does not exist: {path}")
    if not path.is_dir():
        raise AccheadError(f"{what} path is not a directory: {path}")
    if not any((path / name).exists() for name in needs):
        raise AccheadError(f"{path} is not a Hugging Face {what} directory (no {' or '.join(needs)})")
    return {}


@functools.lru_cache(maxsize=1)
def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers one HEAD request within `timeout` s (no retries; cached).

    False when `HF_HUB_OFFLINE` is set. Proxies configured in the environment are used as for downloads.
    """
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    try:
        from huggingface_hub.utils import get_session

        get_session().head(constants.ENDPOINT, timeout=timeout)
    except Exception:  # DNS failure, refused connection, timeout, proxy error: all mean "not now"
        return False
    return True


def _check_hub_id(name: str, needs: tuple[str, ...], what: str) -> dict[str, Any]:
    """Fail in seconds, with one line, for a name that is neither a local path nor a reachable hub model.

    A missing path whose parent directory exists (`runs/pycode-draf` beside `runs/`) is a mistyped path,
    not a hub id. A hub id found in the local cache loads from it, offline if the hub is unreachable.
    Otherwise the hub is probed once: unreachable (offline, `HF_HUB_OFFLINE`) is one line at once,
    instead of transformers' retries of about a minute.
    """
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    parent = Path(name).expanduser().parent
    if str(parent) not in ("", ".") and parent.is_dir():
        raise AccheadError(f"{what} path does not exist: {name}")
    try:
        cached = any(isinstance(try_to_load_from_cache(name, f), str) for f in needs)
    except HFValidationError:
        raise AccheadError(f"{what} path does not exist, and {name!r} is not a valid hub id") from None
    if cached:
        return {} if hub_reachable() else {"local_files_only": True}
    if not hub_reachable():
        raise AccheadError(
            f"{what} {name!r} is not a local directory, not in the local Hugging Face cache, and the hub "
            "is unreachable (offline or HF_HUB_OFFLINE set)"
        )
    return {}


def _source(path_or_id: str | Path, needs: tuple[str, ...], what: str) -> tuple[str, dict[str, Any]]:
    """(what `from_pretrained` reads, its extra keyword arguments) for a directory, a hub id or a GGUF
    file (read from its directory with `gguf_file=`; transformers dequantises it, needing `gguf`)."""
    if str(path_or_id).endswith(".gguf"):
        path = Path(path_or_id).expanduser()
        if not path.is_file():
            raise AccheadError(f"{what} GGUF file does not exist: {path}")
        return str(path.parent), {"gguf_file": path.name}
    return str(Path(path_or_id).expanduser()), _check_model_dir(path_or_id, needs, what)


def load_causal_lm(
    path_or_id: str | Path,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    device_map: str | None = None,
    max_memory: dict[int | str, int] | None = None,
) -> PreTrainedModel:
    """A causal LM in eval mode, from a local Hugging Face directory, a GGUF file or a hub id.

    Args:
        path_or_id: model directory (config.json + weights), `.gguf` file (dequantised on load) or hub id.
        dtype: parameter dtype; "float32" by default because the demo pair is stored in float16 but CPU
            kernels are fastest and exact in float32.
        device: where to put the model when `device_map` is None.
        device_map: passed to `from_pretrained` (e.g. "auto" to shard a large target over GPUs with
            accelerate); `device` is then ignored.
        max_memory: with `device_map`, bytes per device (GPU index or "cpu"); devices left out get no
            weights (how one of several processes keeps its target on its own GPUs).
    """
    src, hub = _source(path_or_id, ("config.json",), "model")
    kwargs: dict[str, Any] = {"dtype": parse_dtype(dtype), **hub}
    if device_map is not None:
        kwargs["device_map"] = device_map
        if max_memory is not None:
            kwargs["max_memory"] = max_memory
    else:
        check_device(device)
    try:
        model = AutoModelForCausalLM.from_pretrained(src, **kwargs)
    except (OSError, ValueError) as e:
        raise AccheadError(f"cannot load a causal LM from {_describe(path_or_id)}: {_first_line(e)}") from e
    if device_map is None:
        model = model.to(device)
    return model.eval()


def load_tokenizer(path_or_id: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved beside a model (or in a GGUF file, or a hub id's)."""
    needs = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    src, hub = _source(path_or_id, needs, "tokenizer")
    try:
        return AutoTokenizer.from_pretrained(src, **hub)
    except (OSError, ValueError) as e:
        raise AccheadError(f"cannot load a tokenizer from {_describe(path_or_id)}: {_first_line(e)}") from e


def check_tokenizers_match(target_tok: PreTrainedTokenizerBase, draft_tok: PreTrainedTokenizerBase) -> None:
    """Raise AccheadError unless draft and target can share token ids.

    Speculative decoding feeds the same ids to both models, so what must agree is the meaning of every
    id: the full token -> id mapping (`get_vocab()`, added/special tokens included) and the EOS id (both
    models must stop on the same token). Normalizers and pre-tokenizers are deliberately not compared:
    the prompt is encoded once, by the target's tokenizer, and only ids cross between the models.
    """
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv != dv:
        if len(tv) != len(dv):
            raise AccheadError(
                f"tokenizers differ: target has {len(tv)} tokens, draft has {len(dv)}; "
                "draft and target must share one vocabulary"
            )
        # Same size but unequal: some target token is missing from the draft or has another id there.
        tok = min(t for t in tv if dv.get(t) != tv[t])
        raise AccheadError(
            f"tokenizers differ: token {tok!r} is id {tv[tok]} in the target, {dv.get(tok)} in the draft; "
            "draft and target must share one vocabulary"
        )
    if target_tok.eos_token_id != draft_tok.eos_token_id:
        raise AccheadError(
            f"tokenizers differ: eos id is {target_tok.eos_token_id} in the target, "
            f"{draft_tok.eos_token_id} in the draft"
        )


def model_identity(model: PreTrainedModel) -> dict[str, Any]:
    """What a head records about its draft: `{"name", "hidden_size", "vocab_size", "fingerprint"}`.

    `name` is informational (the model directory's name or the hub id) and never compared. `fingerprint`
    is a sha256 (first 16 hex digits) of the config fields that fix the architecture plus the sign (-, 0,
    +) of a strided sample of the input-embedding weights. Signs, not values rounded to bfloat16: a
    float32 checkpoint loaded in float16 is rounded twice (fp32 -> fp16 -> bf16), and that differs from
    rounding fp32 -> bf16 once in ~6% of elements (measured on N(0, 0.02) weights), so any hash of rounded
    values would change with the load dtype. A sign changes only when float16 underflows |w| < 3e-8 to 0.
    """
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    emb = model.get_input_embeddings().weight  # (vocab, hidden)
    shape = {k: getattr(cfg, k, None) for k in _SHAPE_KEYS}
    flat = emb.detach().reshape(-1)
    stride = max(1, flat.numel() // _FINGERPRINT_SAMPLES)
    sample = flat[::stride][:_FINGERPRINT_SAMPLES].float().cpu()
    if getattr(cfg, "model_type", None) == "acchead_reduced_llama":
        # its input embedding is the target's, the same in every draft of that target: sample its own head
        head = model.get_output_embeddings().weight.detach().reshape(-1)  # (V_d * H,)
        step = max(1, head.numel() // _FINGERPRINT_SAMPLES)
        sample = torch.cat([sample, head[::step][:_FINGERPRINT_SAMPLES].float().cpu()])
    signs = torch.sign(sample).to(torch.int8).numpy().tobytes()
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode() + b"\0" + signs).hexdigest()
    identity = {
        "name": _model_name(model),
        "hidden_size": int(emb.shape[1]),
        "vocab_size": int(emb.shape[0]),
        "fingerprint": digest[:16],
    }
    if getattr(cfg, "model_type", None) == "acchead_reduced_llama":
        identity["head_rows"] = int(cfg.draft_vocab_size)  # its LM head scores these tokens only
    return identity


def context_length(model: PreTrainedModel) -> int | None:
    """Longest sequence (prompt + generated tokens) the model was built for: `max_position_embeddings`.

    None when the config names no limit. Positions past it still run (rotary embeddings extrapolate) but
    the output is junk, so decoders refuse them (`check_prompt`).
    """
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n = getattr(cfg, "max_position_embeddings", None)
    return int(n) if n else None


def check_prompt(
    prompt: torch.Tensor, max_new_tokens: int, models: list[PreTrainedModel], truncate_hint: str = ""
) -> None:
    """One-line AccheadError unless every model can read `prompt` ((T,) ids) and generate `max_new_tokens`.

    Checks that every id is a row of every model's input embedding (an id past it would index out of
    range, or read a row no token maps to), and that T + max_new_tokens fits every model's context.
    `truncate_hint` is appended to the context error (a CLI names its truncation flag there).
    """
    n = int(prompt.numel())
    if n and (int(prompt.min()) < 0 or int(prompt.max()) >= min(_vocab_rows(m) for m in models)):
        bad = int(prompt.min()) if int(prompt.min()) < 0 else int(prompt.max())
        rows = min(map(_vocab_rows, models))
        raise AccheadError(f"token id {bad} in input_ids is outside the vocabulary (ids 0..{rows - 1})")
    limits = [c for c in map(context_length, models) if c is not None]
    if limits and n + max_new_tokens > min(limits):
        raise AccheadError(
            f"prompt of {n} tokens + max_new_tokens {max_new_tokens} exceeds the model's {min(limits)}-token "
            f"context{truncate_hint}"
        )


def _vocab_rows(model: PreTrainedModel) -> int:
    """Ids a model accepts: its config's vocabulary (a reduced-vocabulary draft embeds fewer rows)."""
    return int(getattr(model.config, "vocab_size", None) or model.get_input_embeddings().weight.shape[0])


def final_hidden(outputs: Any) -> torch.Tensor:
    """The vector the LM head reads, (B, T, H), from a forward run with `output_hidden_states=True`.

    In transformers' decoder-only models the last entry of `hidden_states` is taken after the final
    norm, so `lm_head(final_hidden(out)) == out.logits` (pinned by a test for Llama).
    """
    hidden = getattr(outputs, "hidden_states", None)
    if hidden is None:
        raise ValueError("outputs carry no hidden_states; run the forward with output_hidden_states=True")
    return hidden[-1]


def _model_name(model: PreTrainedModel) -> str:
    name = str(getattr(model, "name_or_path", "") or getattr(model.config, "name_or_path", ""))
    if not name:
        return str(model.config.model_type)
    # A local directory is named by its last component: absolute paths differ between machines.
    return Path(name).name if Path(name).exists() else name


def native_bfloat16(device: torch.device) -> bool:
    """Whether bfloat16 autocast pays on `device`: a CUDA device, or a CPU whose matrix units compute in
    bfloat16 (AMX or AVX-512 BF16, as torch reports them through `torch.cpu`; read, never set). Elsewhere
    it is emulated and slower than float32: 63 positions/s against 424 for SmolLM2's teacher-forced forward
    on an AVX2-only AMD EPYC (2 threads, 2026-12-07); 5x for the demo pair's teacher (docs/pair.md)."""
    if device.type == "cuda":
        return True
    if device.type != "cpu":
        return False
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def check_device(device: str) -> None:
    """AccheadError (one line) unless `device` names a torch device this machine has."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise AccheadError(f"invalid device {device!r} (expected e.g. cpu, cuda, cuda:1, mps)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise AccheadError(f"device {device!r} requested but this torch sees no CUDA device")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise AccheadError(f"device {device!r} requested but MPS is not available")


def _describe(path_or_id: str | Path) -> str:
    """How an error names what it tried: a missing relative path was taken for a hub id."""
    if Path(path_or_id).expanduser().exists():
        return str(path_or_id)
    return f"{path_or_id!s} (no such local directory; tried it as a hub id)"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def output_embedding_table(model: PreTrainedModel) -> torch.Tensor:
    """(V, H) the model's LM-head row of every token id, what a lookahead head's "token" input reads. A
    reduced-vocabulary draft (`acchead.reduced_vocab`) has rows for its V_d tokens only: the others are
    zero (it never proposes them, so a head never judges them)."""
    head = model.get_output_embeddings()
    if hasattr(head, "full_weight"):
        return head.full_weight()
    return head.weight.detach()
