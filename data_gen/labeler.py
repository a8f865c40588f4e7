"""The per-batch labelling math of DESIGN §2: sample X from the target, label draft tokens, mix, featurise.

For a batch of tokenised prompts:

1. The target samples a response X under S with a KV cache (our own loop, not `generate`, because every
   prompt draws from its own random stream; see `stream_uniforms`). A response ends after EOS (kept: it
   is a position the decoder also verifies) or at `max_new_tokens`.
2. The draft decodes alongside, with its own KV cache: prefilled over the same left-padded prompts, then
   fed the same X_{i-1} at every step. At step i the two models' step logits give, via
   `acchead.sampling.probs_from_logits`, `p_i = S(p(.|x, X_<i))` (the distribution X_i is sampled from)
   and `q_i = S(q(.|x, X_<i))`.
3. In the same step, `Y_i ~ q_i` and `accept_prob_i = min(1, p_i(Y_i) / q_i(Y_i))` (q_i(Y_i) > 0 because
   Y_i was drawn from q_i); steps 1-3 are `sample_and_label`. Labelling online costs no second target
   forward over prompt+X and no second application of S (a vocabulary sort under top-p) to p, and the
   label uses exactly the p_i that X_i was drawn from rather than a recomputation equal up to rounding.
4. `Z_i = X_i` with probability `mix_ratio`, else `Y_i`.
5. Optionally one more draft forward over prompt+Z, whose `final_hidden` states feed both head kinds
   (DESIGN §3.1), stored as float16: a `candidate` head reads the state at each position that holds a
   from-draft `Z_i` (e_i, after Y_i was fed); a `lookahead` head reads, for EVERY response position i,
   the state one position earlier (s_{i-1}, the one that produces q(.|x, Z_<i)) together with Y_i.

Padding: a batch is laid out as `[left pad | prompt | response | right pad]`, so every prompt ends in the
same column P and response position i sits in column P + i for every row. Pad positions are masked out of
attention and position ids count only real tokens (`cumsum(mask) - 1`), so a row's numbers do not depend
on how much padding its batch needed beyond float rounding. Callers batch prompts of similar length to
keep that padding small (`acchead.data_gen.shards.plan_batches`).

Labels from responses generated elsewhere (`label_responses`, `acchead-gen-data --responses`): a serving
engine samples X; steps 1-3 become one teacher-forced forward of each model over prompt + X, which gives
q_i and p_i at every position at once (`label_teacher_forced`). Y_i is drawn from the same uniform of the
same stream as online, and steps 4-5 are shared, so for the same X the rows equal the online rows up to
float rounding (a full-sequence forward rounds differently from a KV-cached step).

Randomness: each prompt has three independent streams of float64 uniforms (generation, draft sample,
mixing) seeded from `(seed, prompt_index, stream)` and drawn on the CPU, so a row does not depend on which
other prompts share its batch, shard, process or device, and changing `mix_ratio` leaves X and Y unchanged.
A token is drawn from a distribution by inverting its CDF at the row's uniform (`sample_inverse_cdf`):
vectorised over the batch, with no per-row device synchronisation.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel

from acchead.errors import AccheadError
from acchead.models import CACHE_ARG, final_hidden
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
        lookahead_features: (N, H) float16 draft final hidden states of prompt+Z one position before each
            response position (row i: the state after Z_{i-1}, or after the prompt for i = 0), or None.
    """

    prompt_index: int
    prompt_ids: np.ndarray
    response_ids: np.ndarray
    draft_ids: np.ndarray
    mixed_ids: np.ndarray
    from_draft: np.ndarray
    accept_prob: np.ndarray
    features: np.ndarray | None = None
    lookahead_features: np.ndarray | None = None


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


class _Decoder:
    """One model's incremental decoding over a batch: its KV cache, attention mask, positions and last logits.

    Built from left-padded prompts (`prompt_ids`, `prompt_mask` (B, P)), which it prefills; `feed` appends one
    token per row. `logits` (B, V) always predict the next token.
    """

    @torch.no_grad()
    def __init__(self, model: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> None:
        self.model, dev = model, model.device
        self.mask = prompt_mask.to(dev)
        self.positions = position_ids(self.mask)
        self.cache = DynamicCache(config=model.config)
        out = model(
            input_ids=prompt_ids.to(dev),
            attention_mask=self.mask,
            position_ids=self.positions,
            **{CACHE_ARG: self.cache},
            use_cache=True,
            logits_to_keep=1,
        )
        self.positions = self.positions[:, -1:]
        self.logits = out.logits[:, -1]

    @torch.no_grad()
    def feed(self, tokens: torch.Tensor) -> None:
        """Extend every row by one token: tokens (B,)."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.size(0), 1)], dim=1)
        self.positions = self.positions + 1
        out = self.model(
            input_ids=tokens[:, None].to(self.mask.device),
            attention_mask=self.mask,
            position_ids=self.positions,
            **{CACHE_ARG: self.cache},
            use_cache=True,
        )
        self.logits = out.logits[:, -1]


def _pad_vocab(probs: torch.Tensor, size: int) -> torch.Tensor:
    """Zero-pad (..., V) probs to (..., size): a token outside a model's vocabulary has probability 0."""
    extra = size - probs.size(-1)
    return probs if extra == 0 else torch.nn.functional.pad(probs, (0, extra))


@torch.no_grad()
def sample_and_label(
    target: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    sampling: SamplingConfig,
    uniforms: torch.Tensor,
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    draft: PreTrainedModel | None = None,
    draft_uniforms: torch.Tensor | None = None,
) -> tuple[list[list[int]], torch.Tensor | None, torch.Tensor | None]:
    """Sample one response per row from the target under S and label a draft token at every step.

    Args:
        prompt_ids, prompt_mask: (B, P) left-padded prompts (`left_pad`).
        uniforms: (B, >= max_new_tokens) float64, row b's generation stream; step t uses column t.
        eos_ids: a response ends right after the first of these (included).
        draft: decodes alongside the target to label; None samples only (to time the loop alone).
        draft_uniforms: (B, >= max_new_tokens) float64, row b's draft stream; step t draws Y_t with column t.

    Returns:
        (responses, draft_ids, accept_prob): B token lists X of length 1..max_new_tokens, and (B, T) CPU
        tensors Y (int64) and min(1, p_t(Y_t) / q_t(Y_t)) (float32) for the T steps run; row b's first
        len(responses[b]) columns are its labels. Both are None without a draft.

    Raises:
        AccheadError: the target sampled a token outside the draft's embeddings (it cannot be fed).
    """
    bsz = prompt_mask.size(0)
    tgt = _Decoder(target, prompt_ids, prompt_mask)
    drf = None if draft is None else _Decoder(draft, prompt_ids, prompt_mask)
    dev = tgt.logits.device
    eos = torch.tensor(eos_ids, device=dev)
    uniforms = uniforms.to(dev)
    if drf is not None:
        draft_uniforms = draft_uniforms.to(drf.logits.device)
    # Token ids the draft can be fed (any when sampling only).
    draft_vocab = draft.get_input_embeddings().weight.size(0) if draft is not None else sys.maxsize
    done = torch.zeros(bsz, dtype=torch.bool, device=dev)
    steps, draft_ids, accept_prob = [], [], []
    for t in range(max_new_tokens):
        p = probs_from_logits(tgt.logits, sampling)  # (B, V)
        # Finished rows keep being fed a pad token so the batch stays rectangular; their outputs are unused.
        tok = torch.where(done, pad_id, sample_inverse_cdf(p, uniforms[:, t]))
        steps.append(tok)
        if drf is not None:
            q = probs_from_logits(drf.logits, sampling)  # (B, V_draft)
            y = sample_inverse_cdf(q, draft_uniforms[:, t])
            qy = q.gather(-1, y[:, None]).squeeze(-1)
            p = _pad_vocab(p, max(p.size(-1), q.size(-1)))
            py = p.gather(-1, y[:, None].to(dev)).squeeze(-1).to(qy.device)
            draft_ids.append(y)
            accept_prob.append(torch.clamp(py / qy, max=1.0))
        done = done | torch.isin(tok, eos)
        outside = tok >= draft_vocab
        stop, bad = torch.stack([done.all(), outside.any()]).tolist()  # the one host sync per step
        if bad:
            raise AccheadError(
                f"target sampled token {tok[outside][0].item()}, outside the draft's {draft_vocab} embeddings"
            )
        if t == max_new_tokens - 1 or stop:
            break
        tgt.feed(tok)
        if drf is not None:
            drf.feed(tok)
    tokens = torch.stack(steps, 1).tolist()  # (B, steps)
    eos_set = set(eos_ids)
    responses = []
    for row in tokens:
        end = next((i + 1 for i, x in enumerate(row) if x in eos_set), len(row))
        responses.append(row[:end])
    if drf is None:
        return responses, None, None
    return responses, torch.stack(draft_ids, 1).cpu(), torch.stack(accept_prob, 1).float().cpu()


# Float32 elements of one chunk of (rows, positions, V) distributions in `label_teacher_forced`: S (a sort
# under top-p) makes a few copies, so a chunk costs a small multiple of 4 * this many bytes (~128 MiB).
TF_CHUNK_ELEMENTS = 2**25


@torch.no_grad()
def _response_logits(
    model: PreTrainedModel, seq_ids: torch.Tensor, seq_mask: torch.Tensor, n: int
) -> torch.Tensor:
    """The logits of the last n + 1 columns but the very last: (B, W) -> (B, n, V), right-aligned.

    With left-padded prompt+response rows, column j of the result predicts the token in column W - n + j,
    so row b's response position i (of len_b) is column n - len_b + i. Kept right-aligned, not gathered
    into place: the (B, n, V) tensor is the largest of the labelling and is never copied.
    """
    dev = model.device
    mask = seq_mask.to(dev)
    out = model(
        input_ids=seq_ids.to(dev), attention_mask=mask, position_ids=position_ids(mask), logits_to_keep=n + 1
    )
    return out.logits[:, :-1]


def _realign(x: torch.Tensor, start: torch.Tensor, to_right: bool) -> torch.Tensor:
    """Move (B, n) per-position values between left alignment (position i in column i) and right alignment
    (position i in column start[b] + i). Vacated columns repeat a neighbour (the callers ignore them)."""
    cols = torch.arange(x.size(1), device=x.device)[None]
    shift = start.to(x.device)[:, None]
    idx = (cols - shift).clamp(min=0) if to_right else (cols + shift).clamp(max=x.size(1) - 1)
    return x.gather(1, idx)


@torch.no_grad()
def label_teacher_forced(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prompts: list[list[int]],
    responses: list[list[int]],
    sampling: SamplingConfig,
    draft_uniforms: torch.Tensor,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Label given responses: one teacher-forced forward of each model over prompt + X (DESIGN §2).

    p_i = S(p(.|x, X_<i)) and q_i = S(q(.|x, X_<i)) for every response position at once; Y_i ~ q_i by
    inverting q_i's CDF at column i of the row's draft stream, exactly as `sample_and_label` does at step i;
    label min(1, p_i(Y_i) / q_i(Y_i)). The draft runs first and keeps only Y and q(Y), so the two models'
    (B, N, V) logits are never held at once; S is applied in chunks of positions (`TF_CHUNK_ELEMENTS`).

    Rows are laid out as [left pad | prompt | response] (every row ends in the last column, the least
    padding for responses of any length mix); positions count real tokens only, as online.

    Args:
        prompts, responses: B token lists each; every response non-empty, every id inside both models'
            embeddings (the caller validates: `acchead.data_gen.responses`).
        draft_uniforms: (B, >= N) float64, row b's draft stream; position i draws Y_i with column i.
        pad_id: fed in padding positions (masked).

    Returns:
        (draft_ids, accept_prob): (B, N) CPU tensors, int64 and float32, N = the longest response; row b's
        first len(responses[b]) columns are its labels.
    """
    seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
    seq_ids, seq_mask = left_pad(seqs, pad_id, torch.device("cpu"))
    n = max(len(r) for r in responses)
    start = torch.tensor([n - len(r) for r in responses])  # row b's first response column (right-aligned)

    q_logits = _response_logits(draft, seq_ids, seq_mask, n)  # (B, N, V_draft)
    if sampling.greedy:
        # S's one-hot q_i: Y_i is its argmax for any uniform and q_i(Y_i) = 1, bit for bit what
        # `sample_inverse_cdf` returns (`process_logits` picks the same first argmax); no (B, N, V) softmax.
        y = q_logits.argmax(-1)
        qy = torch.ones(y.shape, device=y.device)
    else:
        u = _realign(draft_uniforms[:, :n], start, to_right=True).to(q_logits.device)
        step = max(1, TF_CHUNK_ELEMENTS // (len(seqs) * q_logits.size(-1)))
        ys, qys = [], []
        for c in range(0, n, step):
            q = probs_from_logits(q_logits[:, c : c + step], sampling)  # (B, chunk, V_draft)
            ys.append(sample_inverse_cdf(q, u[:, c : c + step]))
            qys.append(q.gather(-1, ys[-1][..., None]).squeeze(-1))
            del q
        y, qy = torch.cat(ys, 1), torch.cat(qys, 1)  # (B, N), right-aligned
    del q_logits

    p_logits = _response_logits(target, seq_ids, seq_mask, n)  # (B, N, V_target)
    y_t = y.to(p_logits.device)
    # A draft token outside the target's vocabulary has p = 0 (as `_pad_vocab` makes it online).
    inside = y_t < p_logits.size(-1)
    y_in = torch.where(inside, y_t, 0)
    if sampling.greedy:
        py = (p_logits.argmax(-1) == y_in).float()  # the one-hot p_i at Y_i
    else:
        step = max(1, TF_CHUNK_ELEMENTS // (len(seqs) * p_logits.size(-1)))
        pys = []
        for c in range(0, n, step):
            p = probs_from_logits(p_logits[:, c : c + step], sampling)  # (B, chunk, V_target)
            pys.append(p.gather(-1, y_in[:, c : c + step, None]).squeeze(-1))
            del p
        py = torch.cat(pys, 1)
    py = torch.where(inside, py, 0.0).to(qy.device)
    accept = torch.clamp(py / qy, max=1.0)
    return _realign(y, start, to_right=False).cpu(), _realign(accept, start, to_right=False).float().cpu()


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

    def label(self, prompt_indices: list[int], prompts: list[list[int]]) -> list[LabeledRow]:
        """Label one batch; prompts are token lists (best of similar length). Returns rows in input order."""
        ids, mask = left_pad(prompts, self.pad_id, self.target.device)
        gen_u, draft_u = (self._uniforms(prompt_indices, stream) for stream in ("generate", "draft"))
        responses, draft_ids, accept_prob = sample_and_label(
            self.target, ids, mask, self.sampling, gen_u, self.max_new_tokens, self.eos_ids, self.pad_id,
            draft=self.draft, draft_uniforms=draft_u,
        )  # fmt: skip
        return self._rows(prompt_indices, prompts, responses, draft_ids, accept_prob)

    def label_responses(
        self, prompt_indices: list[int], prompts: list[list[int]], responses: list[list[int]]
    ) -> list[LabeledRow]:
        """Label one batch of responses generated elsewhere (teacher-forced, `label_teacher_forced`).

        Each response is taken as the target's sample X, as is: its length (1..max_new_tokens) and ids
        inside both models' embeddings are the caller's to check. For X equal to what `label` samples, the
        rows equal `label`'s up to float rounding: same streams, same mixing, same features.
        """
        draft_ids, accept_prob = label_teacher_forced(
            self.target, self.draft, prompts, responses, self.sampling,
            self._uniforms(prompt_indices, "draft"), self.pad_id,
        )  # fmt: skip
        return self._rows(prompt_indices, prompts, responses, draft_ids, accept_prob)

    def _uniforms(self, prompt_indices: list[int], stream: str) -> torch.Tensor:
        """(B, max_new_tokens) float64: each prompt's first uniforms of `stream`."""
        return torch.from_numpy(
            np.stack([stream_uniforms(self.seed, i, stream, self.max_new_tokens) for i in prompt_indices])
        )

    def _rows(
        self,
        prompt_indices: list[int],
        prompts: list[list[int]],
        responses: list[list[int]],
        draft_ids: torch.Tensor,
        accept_prob: torch.Tensor,
    ) -> list[LabeledRow]:
        """Steps 4-5 for labelled responses: mix Z, then (optionally) the draft's states over prompt + Z.

        draft_ids, accept_prob: (B, >= N) CPU tensors; row b's first len(responses[b]) columns are used.
        """
        rows, mixed = [], []
        for b, (pi, resp) in enumerate(zip(prompt_indices, responses, strict=True)):
            n = len(resp)
            y = draft_ids[b, :n].numpy().astype(np.int32)
            u = stream_uniforms(self.seed, pi, "mix", n)
            from_draft = u >= self.mix_ratio  # P(Z_i = X_i) = P(u < r) = r
            x = np.asarray(resp, dtype=np.int32)
            z = np.where(from_draft, y, x)
            mixed.append(z.tolist())
            rows.append(
                LabeledRow(
                    prompt_index=pi,
                    prompt_ids=np.asarray(prompts[b], dtype=np.int32),
                    response_ids=x,
                    draft_ids=y,
                    mixed_ids=z,
                    from_draft=from_draft,
                    accept_prob=accept_prob[b, :n].numpy(),
                )
            )
        if self.cache_features:
            ids, mask = left_pad(prompts, self.pad_id, self.draft.device)
            z_ids, z_mask = _sequence_batch(ids, mask, mixed, self.pad_id)
            n_max = max(len(r) for r in responses)
            # Column j of the (n_max + 1) last states: j = 0 after the prompt, j = i after Z_i.
            feats = draft_features(self.draft, z_ids, z_mask, n_max + 1)  # (B, N_max + 1, H)
            for b, row in enumerate(rows):
                n = len(row.response_ids)
                sel = torch.from_numpy(row.from_draft).to(feats.device)
                row.features = feats[b, 1 : n + 1][sel].to(torch.float16).cpu().numpy()
                row.lookahead_features = feats[b, :n].to(torch.float16).cpu().numpy()
        return rows
