"""The draft for a target: its vocabulary, its initialisation from the target, and its training.

The draft is a `ReducedVocabLlamaForCausalLM` (`acchead.reduced_vocab`): a few Llama layers of the target's
width, the target's own input embedding (frozen, not shipped), and a head over the V_d tokens the target
writes most often. It starts from the target itself -- its head rows of the vocabulary (the target ties
head and embedding), the chosen layers and its final norm -- and is trained to predict the target's greedy
responses (hard labels: the target's argmax at each response position, what greedy verification accepts),
prompt positions excluded, and positions whose token lies outside the vocabulary excluded from the loss
(the draft cannot propose them) but counted as misses by `agreement`.

Training is one resumable loop: `train_draft` continues from `<out>/checkpoint.pt` (model, optimizer,
step, tokens seen) when it exists, and writes it atomically every `checkpoint_seconds`; the draft itself
is saved as a transformers directory at the end and at every checkpoint (bf16, the size that ships).
"""

from __future__ import annotations

import copy
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from acchead.distill.responses import ResponseShard
from acchead.errors import AccheadError
from acchead.feature_draft import FeatureDraftConfig, FeatureDraftForCausalLM
from acchead.reduced_vocab import ReducedVocabConfig, ReducedVocabLlamaForCausalLM, embedding_fingerprint
from acchead.rundir import atomic_write, atomic_write_json

IGNORE = -100  # label of positions that are not trained on (the prompt, padding)
OUTSIDE = -1  # label of a response position whose token the draft's head does not cover (a sure miss)


def build_vocabulary(
    shards: list[ResponseShard], size: int, always: tuple[int, ...] = (), background: Counter | None = None
) -> torch.Tensor:
    """(size,) int64: the `always` ids, then ids by frequency in the responses, then in `background` (token
    counts of other assistant text: they rank the tokens a few shards of responses have not shown yet),
    then in the prompts (ties by id). ValueError when fewer than `size` distinct ids are seen."""
    responses = Counter(t for s in shards for r in s.responses for t in r)
    prompts = Counter(t for s in shards for p in s.prompts for t in p)
    background = background or Counter()
    seen = set(responses) | set(prompts) | set(background)
    ranked = sorted(seen, key=lambda t: (-responses[t], -background[t], -prompts[t], t))
    fixed = set(always)
    ranked = [*always, *(t for t in ranked if t not in fixed)]
    if len(ranked) < size:
        raise ValueError(f"the responses hold {len(ranked)} distinct tokens, fewer than the {size} asked for")
    return torch.tensor(ranked[:size], dtype=torch.long)


def coverage(shards: list[ResponseShard], vocab: torch.Tensor) -> float:
    """Share of response tokens inside `vocab` (an upper bound on the draft's top-1 agreement)."""
    kept = set(vocab.tolist())
    total = sum(len(r) for s in shards for r in s.responses)
    return sum(t in kept for s in shards for r in s.responses for t in r) / max(total, 1)


# Targets whose decoder layers a Llama layer loads (the same norms, activation and rotary positions), with
# the Llama config's switches that make it so: the draft starts from copies of them. Qwen 2's attention
# has biases on q, k and v (a Llama layer with `attention_bias` has one on o too, which starts at zero);
# Qwen 3's norms each head's q and k (`ReducedVocabConfig.qk_norm`) and has biases where its config says.
# Others (Gemma's extra norms and scaled embedding, Phi 3's fused projections, SmolLM3's rotary-free
# layers, GPT-2) would need a draft class of their own.
LLAMA_LAYOUT: dict[str, dict[str, object]] = {
    "llama": {}, "mistral": {}, "qwen2": {"attention_bias": True}, "qwen3": {"qk_norm": True},
}  # fmt: skip


def check_llama_layout(target) -> dict[str, object]:
    """The Llama config's switches for `target`'s layers (`LLAMA_LAYOUT`, and the target's own
    `attention_bias` and `mlp_bias`); one line unless they are Llama's: the distilled draft copies them."""
    kind = getattr(target.config, "model_type", None)
    if kind not in LLAMA_LAYOUT:
        raise AccheadError(
            f"acchead-distill starts its draft from copies of the target's layers, which needs a "
            f"Llama-layout target ({', '.join(LLAMA_LAYOUT)}); this one is {kind!r}: bring your own draft"
        )
    biases = {name: bool(getattr(target.config, name, False)) for name in ("attention_bias", "mlp_bias")}
    return {**biases, **LLAMA_LAYOUT[kind]}


def _copy_layer(mine: torch.nn.Module, theirs: torch.nn.Module) -> None:
    """Load target layer `theirs` into draft layer `mine`; a bias the target lacks (Qwen 2's o_proj) is
    zero, so the copy computes what the target's layer does."""
    missing, unexpected = mine.load_state_dict(theirs.state_dict(), strict=False)
    if unexpected or any(not k.endswith(".bias") for k in missing):
        raise AccheadError(f"the target's layer does not load into a Llama layer: missing {missing}, "
                           f"unexpected {unexpected}")  # fmt: skip
    for key in missing:
        mine.get_parameter(key).zero_()  # under init_from_target's no_grad


def init_from_target(
    target,
    vocab: torch.Tensor,
    layers: tuple[int, ...],
    embedding_source: str | None = None,
    feature: bool = False,
) -> ReducedVocabLlamaForCausalLM:
    """A draft with the target's width, its input embedding (frozen), `len(layers)` of its layers
    (copied), its final norm, and as head the target's head rows of `vocab`. `embedding_source` is recorded
    for loading (see `acchead.reduced_vocab`). `feature`: a feature (EAGLE) draft that also reads the
    target's states (`acchead.feature_draft`)."""
    switches = check_llama_layout(target)
    tc = target.config
    emb = target.get_input_embeddings().weight.detach()
    config_cls, model_cls = (
        (FeatureDraftConfig, FeatureDraftForCausalLM) if feature
        else (ReducedVocabConfig, ReducedVocabLlamaForCausalLM)
    )  # fmt: skip
    config = config_cls(
        draft_vocab_size=len(vocab), vocab_size=tc.vocab_size, hidden_size=tc.hidden_size,
        intermediate_size=tc.intermediate_size, num_hidden_layers=len(layers),
        num_attention_heads=tc.num_attention_heads, num_key_value_heads=tc.num_key_value_heads,
        head_dim=getattr(tc, "head_dim", None), max_position_embeddings=tc.max_position_embeddings,
        rms_norm_eps=tc.rms_norm_eps, rope_parameters=getattr(tc, "rope_parameters", None),
        bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id, pad_token_id=tc.pad_token_id,
        embedding_source=embedding_source, embedding_fingerprint=embedding_fingerprint(emb), **switches,
    )  # fmt: skip
    draft = model_cls(config)
    with torch.no_grad():
        draft.get_input_embeddings().weight.copy_(emb)
        draft.lm_head.set_vocabulary(vocab)
        draft.lm_head.weight.copy_(target.get_output_embeddings().weight.detach()[vocab])
        for mine, theirs in zip(draft.model.layers, layers, strict=True):
            _copy_layer(mine, target.model.layers[theirs])
        draft.model.norm.load_state_dict(target.model.norm.state_dict())
    draft.generation_config = target.generation_config
    return draft


def grow_layers(draft: ReducedVocabLlamaForCausalLM, count: int) -> ReducedVocabLlamaForCausalLM:
    """`draft` with `count` more decoder layers on top that compute the same function until trained: each
    new layer is a copy of the last one whose output projections (`o_proj`, `down_proj`, with their biases)
    are zero, so it adds nothing to the residual stream (and its other weights get gradients once those
    move off zero, as a LoRA's zero-initialised half does). Returns a new model; `draft` is left as it was."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    config = copy.deepcopy(draft.config)
    config.num_hidden_layers += count
    if getattr(config, "layer_types", None):  # one entry per layer in newer transformers
        config.layer_types = [*config.layer_types, *[config.layer_types[-1]] * count]
    grown = type(draft)(config).to(dtype=draft.dtype)
    # every weight but the new layers', the frozen embedding included (its requires_grad stays False)
    grown.load_state_dict(draft.state_dict(), strict=False)
    with torch.no_grad():
        for layer in grown.model.layers[-count:]:
            layer.load_state_dict(draft.model.layers[-1].state_dict())
            for proj in (layer.self_attn.o_proj, layer.mlp.down_proj):  # Qwen 2's o_proj has a bias
                proj.weight.zero_()
                if proj.bias is not None:
                    proj.bias.zero_()
    grown.generation_config = draft.generation_config
    return grown


def grow_vocabulary(
    draft: ReducedVocabLlamaForCausalLM, token_ids: torch.Tensor
) -> ReducedVocabLlamaForCausalLM:
    """`draft` with head rows for the target ids `token_ids` ((N,) distinct, none in its head) after its own.

    Each new row starts as the least-squares map of the token's input-embedding row (the target's) into the
    head's space: W ≈ E[to_full]·A over the trained rows, A (H, H), so a new token is scored as the rows
    it resembles are (the target's own rows beside the trained ones would not be: those have drifted from
    them). Why: the head's V_d most frequent tokens leave out rare ones the target writes with confidence
    (8.1% of its MT-bench tokens at top-1 probability >= 0.9 lay outside 8,192 rows: docs/real-pair.md);
    q stays zero outside the grown head, so decoding stays exact. Returns a new model; `draft` is left as it
    was."""
    have = draft.lm_head.to_full.cpu()
    token_ids = token_ids.to(torch.long).cpu()
    if token_ids.ndim != 1 or token_ids.numel() < 1 or token_ids.unique().numel() != token_ids.numel():
        raise ValueError(f"need a non-empty 1-d tensor of distinct token ids, got {tuple(token_ids.shape)}")
    if torch.isin(token_ids, have).any():
        raise ValueError("token_ids must be outside the draft's head")
    config = copy.deepcopy(draft.config)
    config.draft_vocab_size += token_ids.numel()
    grown = type(draft)(config).to(dtype=draft.dtype)
    state = draft.state_dict()
    old = state.pop("lm_head.weight")  # (V_d, H)
    for name in ("lm_head.to_full", "lm_head.to_draft"):
        state.pop(name)
    grown.load_state_dict(state, strict=False)
    emb = draft.get_input_embeddings().weight.detach().float().cpu()  # (V, H) the target's rows
    mapping = torch.linalg.lstsq(emb[have], old.float().cpu()).solution  # (H, H)
    with torch.no_grad():
        grown.lm_head.weight.copy_(torch.cat([old.float().cpu(), emb[token_ids] @ mapping]))
        grown.lm_head.set_vocabulary(torch.cat([have, token_ids]))
    grown.generation_config = draft.generation_config
    return grown


def fuse_layers(draft: FeatureDraftForCausalLM, layers: tuple[int, ...]) -> FeatureDraftForCausalLM:
    """`draft` reading the outputs of the target's decoder `layers` beside its final state (EAGLE-3's fused
    states, `FeatureDraftConfig.fused_layers`), computing the same function until trained: the new columns
    of its input projection `fc` start at zero. Returns a new model; `draft` is left as it was."""
    if list(layers) == draft.config.fused_layers:
        return draft
    if draft.config.fused_layers:
        raise ValueError(f"the draft already reads layers {draft.config.fused_layers}, not {list(layers)}")
    config = copy.deepcopy(draft.config)
    config.fused_layers = list(layers)
    fused = type(draft)(config).to(dtype=draft.dtype)
    state = draft.state_dict()
    old = state.pop("fc.weight")  # (H, 2H)
    fused.load_state_dict(state, strict=False)
    with torch.no_grad():
        fused.fc.weight.zero_()
        fused.fc.weight[:, : old.shape[1]] = old
    fused.generation_config = draft.generation_config
    return fused


def pack_examples(shards: list[ResponseShard], to_draft: torch.Tensor, max_len: int) -> list[tuple]:
    """(input ids, labels) per response: prompt + response cut to `max_len`, labels the head row of the
    next token on response positions (OUTSIDE where the head lacks it) and IGNORE on the prompt's."""
    out = []
    for s in shards:
        for p, r in zip(s.prompts, s.responses, strict=True):
            ids = (p + r)[: max_len + 1]
            if len(ids) <= len(p):
                continue
            x = torch.tensor(ids[:-1])
            y = to_draft[torch.tensor(ids[1:])]
            y[: len(p) - 1] = IGNORE  # positions whose next token is still the prompt's
            out.append((x, y))
    return out


def collate(examples: list[tuple], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (B, T) input ids, (B, T) attention mask, (B, T) labels."""
    width = max(len(x) for x, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, IGNORE)
    for i, (x, y) in enumerate(examples):
        ids[i, : len(x)], mask[i, : len(x)], labels[i, : len(y)] = x, 1, y
    return ids, mask, labels


def draft_loss(
    draft: ReducedVocabLlamaForCausalLM, batch: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, float]:
    """(mean cross-entropy over the head's rows at labelled positions it covers, top-1 agreement there)."""
    ids, mask, labels = batch
    # bfloat16 autocast on a GPU (the weights and the optimizer stay float32); a no-op on the CPU
    with torch.autocast("cuda", torch.bfloat16, enabled=ids.device.type == "cuda"):
        hidden = draft.model(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, T, H)
    keep = labels >= 0
    logits = draft.lm_head.draft_logits(hidden[keep])  # (N, V_d)
    loss = torch.nn.functional.cross_entropy(logits.float(), labels[keep])
    return loss, float((logits.argmax(-1) == labels[keep]).float().mean())


@torch.inference_mode()
def agreement(draft, examples: list[tuple], pad_id: int, batch_size: int = 8) -> float:
    """Top-1 agreement of the draft with the target's greedy tokens, teacher-forced: the share of response
    positions where the draft's argmax is the target's token (a token outside its head is a miss)."""
    hits = total = 0
    for b in range(0, len(examples), batch_size):
        ids, mask, labels = (t.to(draft.device) for t in collate(examples[b : b + batch_size], pad_id))
        hidden = draft.model(input_ids=ids, attention_mask=mask).last_hidden_state
        scored = labels != IGNORE
        pred = draft.lm_head.draft_logits(hidden[scored]).argmax(-1)  # (N,) head rows
        hits += int((pred == labels[scored]).sum())  # OUTSIDE (-1) never equals a row
        total += int(scored.sum())
    return hits / max(total, 1)


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation of `train_draft` (recorded in the checkpoint and the draft's training report)."""

    lr: float = 1e-3
    warmup_steps: int = 50
    total_tokens: int = 20_000_000  # the cosine schedule's length in labelled tokens (spans sessions)
    batch_size: int = 8
    max_len: int = 512
    weight_decay: float = 0.0
    seed: int = 0
    checkpoint_seconds: float = 600.0


def _lr(config: TrainConfig, step: int, tokens: int) -> float:
    warm = min(1.0, (step + 1) / config.warmup_steps)
    frac = min(1.0, tokens / config.total_tokens)
    return config.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


TRAINING_FILE = "training.json"  # in an exported draft: how far its training got (a later --init continues)


def _save(out: Path, draft, optimizer, state: dict, config: TrainConfig, tokenizer=None) -> None:
    weights = {
        k: v for k, v in draft.state_dict().items() if k != "model.embed_tokens.weight"
    }  # the target's
    ckpt = {"model": weights, "optimizer": optimizer.state_dict(), "state": state, "config": asdict(config)}
    atomic_write(out / "checkpoint.pt", lambda p: torch.save(ckpt, p))
    export(draft, out / "draft", {**state, "config": asdict(config)}, tokenizer)
    atomic_write_json(out / "progress.json", {**state, "config": asdict(config)})


def export(draft, directory: Path, training: dict | None = None, tokenizer=None) -> None:
    """The draft as a bf16 transformers directory without the target's embedding (what ships), with its
    training state in `training.json` and the target's tokenizer (commands check that the two match);
    the trained float32 weights are left as they are."""
    tmp = directory.with_name(directory.name + ".tmp")
    state = {k: v.to("cpu", torch.bfloat16 if v.is_floating_point() else v.dtype)
             for k, v in draft.state_dict().items()}  # fmt: skip
    state.pop("model.embed_tokens.weight")  # the target's (config.embedding_source)
    draft.save_pretrained(tmp, state_dict=state)
    if training is not None:
        atomic_write_json(tmp / TRAINING_FILE, training)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    if directory.exists():
        for f in directory.iterdir():
            f.unlink()
        directory.rmdir()
    tmp.rename(directory)


@dataclass(frozen=True)
class Objective:
    """What `train_draft` trains: how examples become a batch (labels at index 2, IGNORE/OUTSIDE < 0),
    the loss and batch accuracy of a batch, and the held-out agreement of a list of examples."""

    collate: Callable[[list[tuple], int], tuple[torch.Tensor, ...]]
    loss: Callable[[torch.nn.Module, tuple[torch.Tensor, ...]], tuple[torch.Tensor, float]]
    agreement: Callable[[torch.nn.Module, list[tuple], int], float]


INDEPENDENT = Objective(collate, draft_loss, agreement)  # the token-only draft


def train_draft(
    draft, train: list[tuple], held_out: list[tuple], out: Path, config: TrainConfig, pad_id: int,
    max_seconds: float, log=print, start_state: dict | None = None, tokenizer=None,
    objective: Objective = INDEPENDENT,
) -> dict:  # fmt: skip
    """Train for `max_seconds` (or until `config.total_tokens`), resuming `<out>/checkpoint.pt`; the state.

    Without a checkpoint, `start_state` (an exported draft's `training.json`) continues its step and token
    counts, so the schedule goes on where that draft's training stopped (the optimizer starts afresh).
    `objective`: the token-only draft's by default; a feature draft's: `acchead.distill.feature_training`."""
    out.mkdir(parents=True, exist_ok=True)
    trainable = [p for p in draft.parameters() if p.requires_grad]  # not the target's embedding
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
    state = {"step": 0, "tokens": 0, "epoch": 0, "position": 0, "seconds": 0.0}
    if start_state:
        state.update({k: start_state[k] for k in ("step", "tokens", "seconds") if k in start_state})
    if (out / "checkpoint.pt").is_file():
        ckpt = torch.load(out / "checkpoint.pt", weights_only=False, map_location="cpu")
        missing = draft.load_state_dict(ckpt["model"], strict=False).missing_keys
        if set(missing) - {"model.embed_tokens.weight"}:  # only the target's embedding is not checkpointed
            raise ValueError(f"{out / 'checkpoint.pt'} lacks {sorted(missing)}")
        optimizer.load_state_dict(ckpt["optimizer"])
        state = ckpt["state"]
        log(f"resumed at step {state['step']} ({state['tokens']:,} tokens)")
    draft.train()
    start, last_ckpt = time.perf_counter(), time.perf_counter()
    order = np.random.default_rng([config.seed, state["epoch"]]).permutation(len(train))
    bar = tqdm(desc="draft", unit="tok", unit_scale=True, initial=state["tokens"], total=config.total_tokens)
    while time.perf_counter() - start < max_seconds and state["tokens"] < config.total_tokens:
        if state["position"] >= len(order):
            state["epoch"], state["position"] = state["epoch"] + 1, 0
            order = np.random.default_rng([config.seed, state["epoch"]]).permutation(len(train))
        chosen = order[state["position"] : state["position"] + config.batch_size]
        batch = tuple(t.to(draft.device) for t in objective.collate([train[i] for i in chosen], pad_id))
        for group in optimizer.param_groups:
            group["lr"] = _lr(config, state["step"], state["tokens"])
        loss, acc = objective.loss(draft, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        n = int((batch[2] >= 0).sum())
        state["step"] += 1
        state["tokens"] += n
        state["position"] += len(chosen)
        bar.update(n)
        bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{acc:.3f}")
        if time.perf_counter() - last_ckpt > config.checkpoint_seconds:
            state["seconds"] += time.perf_counter() - last_ckpt
            last_ckpt = time.perf_counter()
            _save(out, draft, optimizer, state, config, tokenizer)
    state["seconds"] += time.perf_counter() - last_ckpt
    draft.eval()
    state["held_out_agreement"] = objective.agreement(draft, held_out, pad_id) if held_out else None
    _save(out, draft, optimizer, state, config, tokenizer)
    return state
