"""Cascade Speculative Drafting (papers/cascade_speculative_drafting.txt; DESIGN §6) as a `Drafter`.

Levels, largest first: neural reviewers d_0 .. d_{m−1}, then MaG (level m) at the bottom; n = m + 1.
- Vertical cascade: a neural level never decodes on its own; it reviews a block proposed by the levels
  below it in ONE forward, keeps the accepted prefix and adds one token of its own (correction or bonus).
- Horizontal cascade: a row of the step-limit matrix K says how many tokens each lower level contributes,
  larger levels first (later positions are less likely to survive, so cheaper drafters fill them).
  Row 0 belongs to the target's round (levels 0..n−1); row r ≥ 1 to the review by d_{r−1} (levels
  r..n−1); entries are incremental counts, and a level's output is cut to the row's budget. A row of
  zeros makes its reviewer draft one token autoregressively (a review of nothing is a plain sample).
- Leniency l ≥ 1 loosens the inner reviews only (accept x with probability min(1, l·p(x)/r(x))); the
  target's review — the decoder's verifier — is always exact.

Exactness with sampling: the decoder's verifier needs, for every candidate, the law it was drawn from
given everything before it. For a reviewed position with proposal x ~ r (r the true law of the level
below) the emitted token is x with probability min(1, l·p(x)/r(x)), else a draw from norm(max(p − r, 0)),
so its law is
    out = min(r, l·p) + (1 − Σ min(r, l·p)) · norm(max(p − r, 0))          (= p exactly when l = 1)
and a bonus token's law is p. `review_out_dists` computes it and every candidate carries it as its q.

Greedy (temperature 0): all laws are one-hot; a reviewer accepts x iff x is its argmax or, with
leniency, softmax(x) ≥ max softmax / l (raw logits, temperature 1) — a deterministic rule, so the
emitted token's q is one-hot at it and the target's greedy verification is unaffected.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from acchead.errors import AccheadError
from acchead.inference.drafter_spec import CopySpec, DrafterSpec, MaGSpec, as_drafter_spec
from acchead.inference.drafters import RoundBufferDrafter
from acchead.inference.host_reads import read
from acchead.inference.mag import MaGDrafter, MaxGram
from acchead.inference.verification import token_next_dist, token_tau_probs
from acchead.kv_decode import KVSequence
from acchead.sampling import SamplingConfig, probs_from_logits, sample

Step = tuple[int, torch.Tensor]  # (token, q: (V,) its true law)


def review_out_dists(r: torch.Tensor, p: torch.Tensor, leniency: float) -> torch.Tensor:
    """Law of each token a lenient review emits; r: (L, V) proposal laws, p: (L+1, V) reviewer's.

    Returns (L+1, V): row i < L is the law of the token emitted at position i given positions < i were
    accepted; row L is the bonus token's law p_L.
    """
    if leniency == 1.0:
        return p.clone()  # speculative sampling is exact: the identity of the docstring formula
    n = r.shape[0]
    lp = leniency * p[:n]
    kept = torch.minimum(r, lp)
    residual = (p[:n] - r).clamp_min(0)
    total = residual.sum(-1, keepdim=True)
    # A zero residual means p == r, where rejection has probability 0; p is a harmless stand-in.
    residual = torch.where(total > 0, residual / total.clamp_min(torch.finfo(p.dtype).tiny), p[:n])
    out = kept + (1 - kept.sum(-1, keepdim=True)).clamp_min(0) * residual
    return torch.cat([out, p[n:]])


class _Reviewer:
    """A neural level: one causal LM and its KV cache, returning the logits of a proposed block."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.calls = 0
        self.reset()

    def reset(self) -> None:
        self.seq = KVSequence(self.model)
        self.tokens: list[int] = []  # what the cache holds

    def logits(self, context: list[int], proposals: list[int]) -> torch.Tensor:
        """(L+1, V) float32 logits at the positions that predict proposals[0..L−1] and the token after."""
        full = context + proposals
        # Reuse the longest cached prefix that still matches, but always re-feed context[-1]: its logits
        # are the ones that predict the first proposal.
        limit = min(len(self.tokens), len(context) - 1)
        keep = 0
        while keep < limit and self.tokens[keep] == full[keep]:
            keep += 1
        self.seq.crop(keep)
        logits, _ = self.seq.feed(torch.tensor(full[keep:])[None], keep=len(proposals) + 1)
        self.calls += 1
        self.tokens = full
        return logits[0].float()


def _one_hot(token: int, width: int, device: torch.device) -> torch.Tensor:
    q = torch.zeros(width, device=device)
    q[token] = 1.0
    return q


class CascadeDrafter(RoundBufferDrafter):
    """Vertical + horizontal cascade over neural reviewers and MaG, proposing tokens with their true q.

    Args:
        reviewers: neural levels, largest first (usually just the draft model).
        mag: the MaG proposer at the bottom.
        k: step-limit matrix, rows 0..n−1 with n − r entries in row r (see the module docstring); e.g.
            for one reviewer [[4, 2], [10]]: each target round takes its first 4 candidates from the
            draft's reviews (each review: 10 MaG tokens in one forward, the accepted prefix + one token
            of the draft's), then 2 raw MaG tokens.
        leniency: l ≥ 1 for the inner reviews.
        vocab_size: width of q (the target's vocabulary).
    """

    def __init__(
        self,
        reviewers: Sequence[PreTrainedModel],
        mag: MaxGram,
        k: Sequence[Sequence[int]],
        leniency: float = 1.0,
        vocab_size: int | None = None,
    ) -> None:
        self.levels = [_Reviewer(m) for m in reviewers]
        self.mag = mag
        n = len(self.levels) + 1
        self.k = [list(map(int, row)) for row in k]
        if len(self.k) != n or any(len(row) != n - r for r, row in enumerate(self.k)):
            shape = [n - r for r in range(n)]
            raise AccheadError(f"cascade k needs {n} rows with {shape} entries for {n - 1} reviewer(s) + MaG")
        if any(v < 0 for row in self.k for v in row) or sum(self.k[0]) < 1:
            raise AccheadError("cascade k entries must be >= 0 and the target's row must draft >= 1 token")
        if leniency < 1.0:
            raise AccheadError(f"cascade leniency must be >= 1, got {leniency}")
        self.leniency = float(leniency)
        self.vocab_size = vocab_size or (reviewers[0].config.vocab_size if reviewers else mag.vocab_size)
        self.device = reviewers[0].device if reviewers else torch.device("cpu")
        self.draft_calls = 0
        self._sampling = SamplingConfig()
        self._generator: torch.Generator | None = None
        self._prompt_len = 0
        self._clear_block()

    @property
    def calls_per_level(self) -> list[int]:
        """Forwards of each neural level since `begin`."""
        return [lv.calls for lv in self.levels]

    # ------------------------------------------------------------------------------------- Drafter API

    def begin(self, input_ids: torch.Tensor, sampling: SamplingConfig, seed: int) -> None:
        for lv in self.levels:
            lv.reset()
            lv.calls = 0
        # Host-driven: the inner reviews draw from a sequential generator (fresh numbers for every review,
        # rollbacks included), on the reviewers' device.
        self._sampling = sampling
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._prompt_len = int(input_ids.numel())
        self._clear_block()
        self.draft_calls = 0

    def _propose_block(self, context: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        # One cascade round per target round (or when the stop policy drafts past it). Reviewer caches
        # are re-matched against each new context lazily (longest common prefix), so rollback only
        # drops the block.
        return self._fill(0, read(context))  # host-driven: the cascade works on the host's copy

    # --------------------------------------------------------------------------------------- the cascade

    def _fill(self, row: int, context: list[int]) -> list[Step]:
        """Tokens for the review that owns row `row`: levels row..n−1 in turn, up to their budgets."""
        out: list[Step] = []
        budget = 0
        for level, count in enumerate(self.k[row], start=row):
            budget += count
            while len(out) < budget:
                ctx = context + [t for t, _ in out]
                out += self._produce(level, ctx, budget - len(out))[: budget - len(out)]
        return out

    def _produce(self, level: int, context: list[int], want: int) -> list[Step]:
        """Output of `level`: MaG's `want` tokens, or a reviewer's accepted prefix plus one token."""
        if level == len(self.levels):
            tokens = self.mag.propose(context, self._prompt_len, want)
            return [(t, _one_hot(t, self.vocab_size, self.device)) for t in tokens]
        proposals = self._fill(level + 1, context)
        logits = self.levels[level].logits(context, [t for t, _ in proposals])
        self.draft_calls += 1
        return self._review(logits, proposals)

    def _review(self, logits: torch.Tensor, proposals: list[Step]) -> list[Step]:
        """One reviewer's verdict on `proposals` given its logits (L+1, V): accepted prefix + 1 token."""
        width = self.vocab_size
        if logits.shape[-1] < width:  # a reviewer with a narrower head: those tokens get probability 0
            logits = torch.nn.functional.pad(logits, (0, width - logits.shape[-1]), value=-torch.inf)
        p = probs_from_logits(logits, self._sampling)  # (L+1, V)
        tokens = torch.tensor([t for t, _ in proposals], dtype=torch.long)
        if self._sampling.greedy:
            best = logits.argmax(-1)
            ok = tokens.to(best.device) == best[:-1]
            if self.leniency > 1 and tokens.numel():
                soft = logits[:-1].softmax(-1)
                near = self.leniency * soft.gather(-1, tokens.to(soft.device)[:, None])[:, 0]
                ok |= near >= soft.max(-1).values
            tau_t = ok.long().cumprod(0).sum() if tokens.numel() else best.new_zeros(())
            emitted = self._read_review(tokens, tau_t, best[tau_t])
            return [(t, _one_hot(t, width, p.device)) for t in emitted]
        r = torch.stack([q for _, q in proposals]).to(p.device) if proposals else p[:0]
        # τ from its exact law under leniency: acceptance min(1, l·p/r) is token verification against l·p.
        gen = self._generator
        tau_t = p.new_zeros((), dtype=torch.long)
        if proposals:
            tau_t = sample(token_tau_probs(tokens, r, self.leniency * p), gen)
        nxt_t = sample(token_next_dist(tokens, r, p, tau_t), gen)
        laws = review_out_dists(r, p, self.leniency)
        emitted = self._read_review(tokens, tau_t, nxt_t)
        return [(t, laws[i]) for i, t in enumerate(emitted)]

    @staticmethod
    def _read_review(tokens: torch.Tensor, tau: torch.Tensor, nxt: torch.Tensor) -> list[int]:
        """The review's outcome on the host, in one read: the τ kept proposals, then the next token."""
        status = read(torch.cat([tau.view(1), nxt.view(1), tokens.to(nxt.device)]))
        return [*status[2 : 2 + status[0]], status[1]]


def make_drafter(
    spec: str | DrafterSpec,
    *,
    draft: PreTrainedModel | None,
    bigram: torch.Tensor | Sequence[int] | object,
    vocab_size: int,
) -> MaGDrafter | CascadeDrafter:
    """A model-free or cascaded drafter from its spec (`acchead.inference.drafter_spec`: `mag[:block=10]`,
    `cascade:k=4.2/10[,l=1]`, or their typed values). Pair them with a fixed-K stop policy;
    `specdec:k=<sum of k's first row>` ends each target round where the cascade's round ends. `bigram` is
    MaG's table (`build_bigram_table` / `corpus_bigram_table`)."""
    spec = as_drafter_spec(spec)
    if isinstance(spec, CopySpec):
        raise AccheadError("copy rounds wrap the draft model's own rounds: use copy+POLICY, not a bandit arm")
    mag = MaxGram(bigram)  # type: ignore[arg-type]
    if isinstance(spec, MaGSpec):
        return MaGDrafter(mag, vocab_size, block=spec.block)
    if draft is None:
        raise AccheadError(f"drafter {spec.to_spec()!r} needs a draft model to review MaG's proposals")
    k = [list(row) for row in spec.k]
    return CascadeDrafter([draft], mag, k, leniency=spec.leniency, vocab_size=vocab_size)
