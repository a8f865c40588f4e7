"""The per-batch labelling math of DESIGN §2: sample X from the target, label draft tokens, mix, featurise.

For a batch of tokenised prompts:

1. The target samples a response X under S with a KV cache (acchead's one decode loop,
   `acchead.kv_decode.decode`, not `generate`, because every prompt draws from its own random stream; see
   `acchead.data_gen.streams`). A response ends after EOS (kept: it is a position the decoder also verifies)
   or at `max_new_tokens`.
2. The draft decodes alongside (the loop's follower), with its own KV cache: prefilled over the same
   left-padded prompts, then fed the same X_{i-1} at every step. At step i the two models' step logits give,
   via `acchead.sampling.probs_from_logits`, `p_i = S(p(.|x, X_<i))` (the distribution X_i is sampled from)
   and `q_i = S(q(.|x, X_<i))`.
3. In the same step, `Y_i ~ q_i` and `accept_prob_i = min(1, p_i(Y_i) / q_i(Y_i))` (q_i(Y_i) > 0 because Y_i
   was drawn from q_i); steps 1-3 are `sample_and_label`. Labelling online costs no second target forward
   over prompt+X and no second application of S (a vocabulary sort under top-p) to p, and the label uses
   exactly the p_i that X_i was drawn from rather than a recomputation equal up to rounding.
4. `Z_i = X_i` with probability `mix_ratio`, else `Y_i`.
5. Optionally one more draft forward over prompt+Z, whose `final_hidden` states feed both head kinds (DESIGN
   §3.1), stored as float16: a `candidate` head reads the state at each position that holds a from-draft
   `Z_i` (e_i, after Y_i was fed); a `lookahead` head reads, for EVERY response position i, the state one
   position earlier (s_{i-1}, the one that produces q(.|x, Z_<i)) together with Y_i.

Padding: a batch is laid out as `[left pad | prompt | response | right pad]`
(`acchead.data_gen.batch_layout`); pad positions are masked out of attention and position ids count only
real tokens, so a row's numbers do not depend on how much padding its batch needed beyond float rounding.
Callers batch prompts of similar length to keep that padding small (`acchead.data_gen.shards.plan_batches`).

Labels from responses generated elsewhere (`label_responses`, `acchead-gen-data --responses`): a serving
engine samples X; steps 1-3 become one teacher-forced forward of each model over prompt + X, which gives q_i
and p_i at every position at once (`acchead.data_gen.teacher_forced`). Y_i is drawn from the same uniform of
the same stream as online, and steps 4-5 are shared, so for the same X the rows equal the online rows up to
float rounding (a full-sequence forward rounds differently from a KV-cached step).

Randomness: each prompt has three independent streams of float64 uniforms (generation, draft sample,
mixing; `acchead.data_gen.streams`), so a row does not depend on which other prompts share its batch,
and changing `mix_ratio` leaves X and Y unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel

from acchead.data_gen.batch_layout import left_pad, sequence_batch
from acchead.data_gen.streams import sample_inverse_cdf, stream_uniforms
from acchead.data_gen.teacher_forced import label_teacher_forced
from acchead.feature_draft import TargetFedDraft, is_feature_draft
from acchead.kv_decode import KVSequence, decode, position_ids
from acchead.models import final_hidden
from acchead.sampling import SamplingConfig, probs_from_logits

# The labeller's building blocks, importable from here as before the split.
__all__ = ["LabeledRow", "Labeler", "left_pad", "sample_and_label", "sample_inverse_cdf", "stream_uniforms"]


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
    tgt = KVSequence(target, "the target")
    tgt.feed(prompt_ids, mask=prompt_mask)
    drf = None
    if draft is not None:
        drf = KVSequence(draft, "the draft")
        drf.feed(prompt_ids, mask=prompt_mask)
        draft_uniforms = draft_uniforms.to(drf.device)
    uniforms = uniforms.to(tgt.logits.device)
    draft_ids, accept_prob = [], []

    def choose(t: int, logits: torch.Tensor) -> torch.Tensor:
        """X_t ~ p_t from row b's generation uniform; with a draft, also Y_t ~ q_t and its label (kept for
        every row: those of rows that ended are never read)."""
        p = probs_from_logits(logits, sampling)  # (B, V)
        x = sample_inverse_cdf(p, uniforms[:, t])
        if drf is not None:
            q = probs_from_logits(drf.logits, sampling)  # (B, V_draft)
            y = sample_inverse_cdf(q, draft_uniforms[:, t])
            qy = q.gather(-1, y[:, None]).squeeze(-1)
            p = _pad_vocab(p, max(p.size(-1), q.size(-1)))
            py = p.gather(-1, y[:, None].to(p.device)).squeeze(-1).to(qy.device)
            draft_ids.append(y)
            accept_prob.append(torch.clamp(py / qy, max=1.0))
        return x

    followers = () if drf is None else (drf,)
    steps = decode(tgt, max_new_tokens, choose, eos_ids=eos_ids, pad_id=pad_id, followers=followers)
    tokens = steps.tolist()  # (B, steps)
    eos_set = set(eos_ids)
    responses = []
    for row in tokens:
        end = next((i + 1 for i, x in enumerate(row) if x in eos_set), len(row))
        responses.append(row[:end])
    if drf is None:
        return responses, None, None
    return responses, torch.stack(draft_ids, 1).cpu(), torch.stack(accept_prob, 1).float().cpu()


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
        feature_chain: a feature draft's candidates labelled per round (`TargetFedDraft`'s `levels`).

    A feature (EAGLE) draft (`acchead.feature_draft`) is read through `TargetFedDraft`: X is sampled by the
    target alone and labelled teacher-forced (the draft needs the target's states of X), and its states
    over prompt + Z read the target's states of Z. Rows are those of any draft; with `feature_chain` = 1
    the labels are the first candidate's of a round, with N > 1 position j's are the depth-(j mod N)
    candidate's, which reads the draft's own states as decoding does (labels and states alike).
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
        feature_chain: int = 1,
    ) -> None:
        # A feature (EAGLE) draft reads the target's states: it labels teacher-forced, through the target.
        self.feature = is_feature_draft(draft)
        self.target, self.sampling = target, sampling
        self.draft = TargetFedDraft(draft, target, levels=feature_chain) if self.feature else draft
        self.mix_ratio, self.seed, self.max_new_tokens = mix_ratio, seed, max_new_tokens
        self.eos_ids, self.pad_id, self.cache_features = list(eos_ids), pad_id, cache_features

    def label(self, prompt_indices: list[int], prompts: list[list[int]]) -> list[LabeledRow]:
        """Label one batch; prompts are token lists (best of similar length). Returns rows in input order."""
        ids, mask = left_pad(prompts, self.pad_id, self.target.device)
        gen_u, draft_u = (self._uniforms(prompt_indices, stream) for stream in ("generate", "draft"))
        if self.feature:  # X from the target alone (same stream), then the teacher-forced labels
            responses, _, _ = sample_and_label(
                self.target, ids, mask, self.sampling, gen_u, self.max_new_tokens, self.eos_ids, self.pad_id
            )
            return self.label_responses(prompt_indices, prompts, responses)
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
            z_ids, z_mask = sequence_batch(ids, mask, mixed, self.pad_id)
            n_max = max(len(r) for r in responses)
            # Column j of the (n_max + 1) last states: j = 0 after the prompt, j = i after Z_i.
            feats = draft_features(self.draft, z_ids, z_mask, n_max + 1)  # (B, N_max + 1, H)
            for b, row in enumerate(rows):
                n = len(row.response_ids)
                sel = torch.from_numpy(row.from_draft).to(feats.device)
                row.features = feats[b, 1 : n + 1][sel].to(torch.float16).cpu().numpy()
                row.lookahead_features = feats[b, :n].to(torch.float16).cpu().numpy()
        return rows
