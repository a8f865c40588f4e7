"""The per-batch labelling math of DESIGN §2: sample X from the target, label draft tokens, mix, featurise.

For a batch of tokenised prompts:

1. The target samples a response X under S with a KV cache (our own loop, not `generate`, because every
   prompt draws from its own random stream; see `stream_uniforms`). A response ends after EOS (kept: it
   is a position the decoder also verifies) or at `max_new_tokens`.
2. One target forward and one draft forward over prompt+X give, for every response position i,
   `p_i = S(p(.|x, X_<i))` and `q_i = S(q(.|x, X_<i))` via `acchead.sampling.probs_from_logits`. The
   target's forward reuses the prompt's keys and values from generation (`target_response_logits`).
3. `Y_i ~ q_i`; `accept_prob_i = min(1, p_i(Y_i) / q_i(Y_i))` (q_i(Y_i) > 0 because Y_i was drawn from q_i).
4. `Z_i = X_i` with probability `mix_ratio`, else `Y_i`.
5. Optionally one more draft forward over prompt+Z; the draft's `final_hidden` at each position that holds
   a from-draft `Z_i` is the head's input there, stored as float16.

Padding: a batch is laid out as `[left pad | prompt | response | right pad]`, so every prompt ends in the
same column P and response position i sits in column P + i for every row. Pad positions are masked out of
attention and position ids count only real tokens (`cumsum(mask) - 1`), so a row's numbers do not depend
on how much padding its batch needed beyond float rounding. Callers batch prompts of similar length to
keep that padding small (`data_gen.shards.plan_batches`).

Randomness: each prompt has three independent streams of float64 uniforms (generation, draft sample,
mixing) seeded from `(seed, prompt_index, stream)` and drawn on the CPU, so a row does not depend on which
other prompts share its batch, shard, process or device, and changing `mix_ratio` leaves X and Y unchanged.
A token is drawn from a distribution by inverting its CDF at the row's uniform (`sample_inverse_cdf`):
vectorised over the batch, with no per-row device synchronisation.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache, DynamicLayer, PreTrainedModel

from acchead.errors import AccheadError
from acchead.models import final_hidden
from acchead.sampling import SamplingConfig, probs_from_logits

STREAMS = ("generate", "draft", "mix")


@dataclass
class LabeledRow:
    """One prompt's labelled response. N = response length, F = number of from-draft positions.

    Attributes:
        prompt_index: index of the prompt in the run's prompt list.
        prompt_ids: (P,) prompt tokens.
        response_ids: (N,) X, sampled from the target under S; ends with EOS unless cut at max length.
        draft_ids: (N,) Y, Y_i ~ q_i.
        mixed_ids: (N,) Z.
        from_draft: (N,) bool, Z_i is Y_i.
        accept_prob: (N,) float32, min(1, p_i(Y_i) / q_i(Y_i)).
        features: (F, H) float16 draft final hidden states at the from-draft positions of prompt+Z, or None.
    """

    prompt_index: int
    prompt_ids: np.ndarray
    response_ids: np.ndarray
    draft_ids: np.ndarray
    mixed_ids: np.ndarray
    from_draft: np.ndarray
    accept_prob: np.ndarray
    features: np.ndarray | None = None


def stream_seed(seed: int, prompt_index: int, stream: str) -> int:
    """A 63-bit seed for one prompt's random stream, a hash of (seed, prompt_index, stream)."""
    digest = hashlib.blake2b(f"{seed}:{prompt_index}:{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def stream_uniforms(seed: int, prompt_index: int, stream: str, n: int) -> np.ndarray:
    """The first n float64 uniforms in [0, 1) of one prompt's stream: (n,)."""
    if stream not in STREAMS:
        raise ValueError(f"unknown stream {stream!r}")
    return np.random.default_rng(stream_seed(seed, prompt_index, stream)).random(n)


def sample_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row, drawn by inverting the CDF at a given uniform: probs (..., V), u (...) -> (...).

    Returns the first index whose cumulative probability exceeds u * total, so P(i) = probs_i / total.
    The CDF is accumulated in float64; the clamp keeps a rounding of u * total up to the total from
    landing on a trailing zero-probability token. A one-hot row (greedy) returns its argmax for any u.
    """
    cdf = probs.double().cumsum(-1)
    idx = torch.searchsorted(cdf, (u.double() * cdf[..., -1]).unsqueeze(-1), right=True).squeeze(-1)
    last_positive = probs.size(-1) - 1 - (probs > 0).flip(-1).int().argmax(-1)
    return torch.minimum(idx, last_positive)


def left_pad(seqs: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists -> (ids, mask), both (B, max_len) int64; mask is 1 on real tokens."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[b, width - len(s) :] = 1
    return ids.to(device), mask.to(device)


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) attention mask -> (B, T) positions counting real tokens only (0 on left padding)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def prefill(
    target: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor
) -> tuple[DynamicCache, torch.Tensor]:
    """Run the target over the left-padded prompts: (KV cache, logits of the first response token (B, V))."""
    cache = DynamicCache(config=target.config)
    out = target(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=position_ids(prompt_mask),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return cache, out.logits[:, -1]


@torch.no_grad()
def sample_responses(
    target: PreTrainedModel,
    cache: DynamicCache,
    first_logits: torch.Tensor,
    prompt_mask: torch.Tensor,
    sampling: SamplingConfig,
    uniforms: torch.Tensor,
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
) -> list[list[int]]:
    """Sample one response per row from the target under S, extending the prompts' KV cache.

    Args:
        cache, first_logits: from `prefill`; the cache grows by the fed response tokens.
        prompt_mask: (B, P) mask of the left-padded prompts.
        uniforms: (B, >= max_new_tokens) float64, row b's generation stream; step t uses column t.
        eos_ids: a response ends right after the first of these (included).

    Returns:
        B token lists of length 1..max_new_tokens.
    """
    bsz, in_dev = prompt_mask.size(0), prompt_mask.device
    mask, logits = prompt_mask, first_logits
    positions = position_ids(mask)[:, -1:]
    eos = torch.tensor(eos_ids, device=logits.device)
    uniforms = uniforms.to(logits.device)
    done = torch.zeros(bsz, dtype=torch.bool, device=logits.device)
    steps = []
    for t in range(max_new_tokens):
        probs = probs_from_logits(logits, sampling)  # (B, V)
        # Finished rows keep being fed a pad token so the batch stays rectangular; their outputs are unused.
        tok = torch.where(done, pad_id, sample_inverse_cdf(probs, uniforms[:, t]))
        steps.append(tok)
        done = done | torch.isin(tok, eos)
        if t == max_new_tokens - 1 or bool(done.all()):  # the one host sync per step
            break
        mask = torch.cat([mask, mask.new_ones(bsz, 1)], dim=1)
        positions = positions + 1
        out = target(
            input_ids=tok[:, None].to(in_dev),
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        )
        logits = out.logits[:, -1]
    tokens = torch.stack(steps, 1).tolist()  # (B, steps)
    eos_set = set(eos_ids)
    responses = []
    for row in tokens:
        end = next((i + 1 for i, x in enumerate(row) if x in eos_set), len(row))
        responses.append(row[:end])
    return responses


@torch.no_grad()
def target_response_logits(
    target: PreTrainedModel,
    cache: DynamicCache,
    first_logits: torch.Tensor,
    seq_ids: torch.Tensor,
    seq_mask: torch.Tensor,
    n: int,
) -> torch.Tensor:
    """The target's logits for every response token, (B, n, V): one forward over the responses.

    The prompt part of that forward is the prefill's: the generation cache is cropped back to the
    prompts and the responses run over it in parallel, which equals a forward over prompt+response up to
    float rounding and skips recomputing the prompts. Caches that cannot be cropped (sliding-window
    layers) get a full forward over prompt+response instead.
    """
    if type(cache) is not DynamicCache or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return next_token_logits(target, seq_ids, seq_mask, n)
    if n == 1:
        return first_logits[:, None]
    prompt_len = seq_ids.size(1) - n
    cache.crop(prompt_len - cache.get_seq_length())  # a negative count: tokens to drop from the end
    dev = target.device
    ids, mask = seq_ids[:, :-1].to(dev), seq_mask[:, :-1].to(dev)
    out = target(
        input_ids=ids[:, prompt_len:],
        attention_mask=mask,
        position_ids=position_ids(mask)[:, prompt_len:],
        past_key_values=cache,
        use_cache=True,
    )
    return torch.cat([first_logits[:, None].to(out.logits.device), out.logits], 1)


def _pad_vocab(probs: torch.Tensor, size: int) -> torch.Tensor:
    """Zero-pad (..., V) probs to (..., size): a token outside a model's vocabulary has probability 0."""
    extra = size - probs.size(-1)
    return probs if extra == 0 else torch.nn.functional.pad(probs, (0, extra))


def _sequence_batch(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, responses: list[list[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """[left-padded prompt | right-padded responses] -> (ids, mask), (B, P + N_max)."""
    n_max = max(len(r) for r in responses)
    resp = torch.full((len(responses), n_max), pad_id, dtype=torch.long)
    rmask = torch.zeros_like(resp)
    for b, r in enumerate(responses):
        resp[b, : len(r)] = torch.tensor(r, dtype=torch.long)
        rmask[b, : len(r)] = 1
    dev = prompt_ids.device
    return torch.cat([prompt_ids, resp.to(dev)], 1), torch.cat([prompt_mask, rmask.to(dev)], 1)


@torch.no_grad()
def next_token_logits(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    """Logits predicting the last n tokens of `ids`: (B, T) -> (B, n, V), from one forward over ids[:, :-1].

    With the `_sequence_batch` layout and n = N_max, row [b, i] is the distribution of response token i.
    """
    dev = model.device
    ids, mask = ids[:, :-1].to(dev), mask[:, :-1].to(dev)
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), logits_to_keep=n)
    return out.logits


@torch.no_grad()
def draft_features(draft: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    """The draft's final hidden state at the last n input positions: (B, T) -> (B, n, H)."""
    dev = draft.device
    ids, mask = ids.to(dev), mask.to(dev)
    out = draft(
        input_ids=ids,
        attention_mask=mask,
        position_ids=position_ids(mask),
        output_hidden_states=True,
        logits_to_keep=1,  # the head reads hidden states; skip the (B, T, V) logits
    )
    return final_hidden(out)[:, -n:]


class Labeler:
    """Labels batches of prompts for one (target, draft, S, mix ratio, seed) run.

    Args:
        target, draft: causal LMs sharing a tokenizer; the target may be sharded with a device map.
        sampling: the decoding configuration S, applied to both models' logits.
        mix_ratio: probability r that Z_i is the target's token X_i.
        seed: run seed; per-prompt streams derive from it (`stream_seed`).
        max_new_tokens: response length cap.
        eos_ids: tokens that end a response.
        pad_id: token fed in padding positions (masked, so any valid id works).
        cache_features: also compute the draft's hidden states over prompt+Z.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel,
        sampling: SamplingConfig,
        *,
        mix_ratio: float,
        seed: int,
        max_new_tokens: int,
        eos_ids: list[int],
        pad_id: int,
        cache_features: bool,
    ) -> None:
        self.target, self.draft, self.sampling = target, draft, sampling
        self.mix_ratio, self.seed, self.max_new_tokens = mix_ratio, seed, max_new_tokens
        self.eos_ids, self.pad_id, self.cache_features = list(eos_ids), pad_id, cache_features
        self.draft_vocab = draft.get_input_embeddings().weight.size(0)

    def label(self, prompt_indices: list[int], prompts: list[list[int]]) -> list[LabeledRow]:
        """Label one batch; prompts are token lists (best of similar length). Returns rows in input order."""
        ids, mask = left_pad(prompts, self.pad_id, self.target.device)
        uniforms = torch.from_numpy(
            np.stack([stream_uniforms(self.seed, i, "generate", self.max_new_tokens) for i in prompt_indices])
        )
        cache, first_logits = prefill(self.target, ids, mask)
        responses = sample_responses(
            self.target, cache, first_logits, mask, self.sampling, uniforms, self.max_new_tokens,
            self.eos_ids, self.pad_id,
        )  # fmt: skip
        bad = [t for r in responses for t in r if t >= self.draft_vocab]
        if bad:
            raise AccheadError(
                f"target sampled token {bad[0]}, outside the draft's {self.draft_vocab} embeddings"
            )
        seq_ids, seq_mask = _sequence_batch(ids, mask, responses, self.pad_id)
        n_max = max(len(r) for r in responses)
        p_logits = target_response_logits(self.target, cache, first_logits, seq_ids, seq_mask, n_max)
        q_logits = next_token_logits(self.draft, seq_ids, seq_mask, n_max)
        dev = q_logits.device
        p_logits = p_logits.to(dev)
        vocab = max(p_logits.size(-1), q_logits.size(-1))

        rows, mixed = [], []
        for b, (pi, resp) in enumerate(zip(prompt_indices, responses, strict=True)):
            n = len(resp)
            # Per row, so that the float32 (N, V) distributions of only one row are alive at a time.
            p = _pad_vocab(probs_from_logits(p_logits[b, :n], self.sampling), vocab)
            q = _pad_vocab(probs_from_logits(q_logits[b, :n], self.sampling), vocab)
            y = sample_inverse_cdf(q, torch.from_numpy(stream_uniforms(self.seed, pi, "draft", n)).to(dev))
            py = p.gather(-1, y[:, None]).squeeze(-1)
            qy = q.gather(-1, y[:, None]).squeeze(-1)
            accept = torch.clamp(py / qy, max=1.0)
            u = torch.from_numpy(stream_uniforms(self.seed, pi, "mix", n)).to(dev)
            from_draft = u >= self.mix_ratio  # P(Z_i = X_i) = P(u < r) = r
            x = torch.tensor(resp, dtype=torch.long, device=dev)
            z = torch.where(from_draft, y, x)
            mixed.append(z.tolist())
            rows.append(
                LabeledRow(
                    prompt_index=pi,
                    prompt_ids=np.asarray(prompts[b], dtype=np.int32),
                    response_ids=np.asarray(resp, dtype=np.int32),
                    draft_ids=y.cpu().numpy().astype(np.int32),
                    mixed_ids=z.cpu().numpy().astype(np.int32),
                    from_draft=from_draft.cpu().numpy(),
                    accept_prob=accept.float().cpu().numpy(),
                )
            )
        if self.cache_features:
            z_ids, z_mask = _sequence_batch(ids, mask, mixed, self.pad_id)
            feats = draft_features(self.draft, z_ids, z_mask, n_max)  # (B, N_max, H)
            for b, row in enumerate(rows):
                n = len(row.response_ids)
                sel = torch.from_numpy(row.from_draft).to(feats.device)
                row.features = feats[b, :n][sel].to(torch.float16).cpu().numpy()
        return rows
