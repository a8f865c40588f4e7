"""One row of a batched decode (`acchead.inference.batched.BatchedDecoder`): its committed ids on the host,
its limits, its statistics, and what a verified round commits to it.

A row ends at an accepted EOS, at its stop check (how stop strings end a row: it returns how many of the
row's new tokens to keep) or at its max new tokens; the commit after each round applies them in that order,
as `SpeculativeDecoder.generate` does for one prompt. A policy with per-decode state (AdaEDL's online λ)
keeps it in the row's `run`, advanced after each of the row's rounds, so every row adapts to its own
acceptance exactly as it would decoded alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from acchead.errors import AccheadError
from acchead.inference.device_random import NEXT, TAU, key_hash
from acchead.inference.policies import PolicyRun
from acchead.inference.results import GenerationResult
from acchead.models import check_prompt
from acchead.sampling import SamplingConfig, probs_from_logits


@dataclass
class Row:
    """One prompt's decoding state: committed ids (prompt + generated) on the host.

    Attributes:
        ids: the prompt and every token committed so far. prompt_len, max_new, seed: as given.
        stop_check: called with the row's new tokens of a round; how many to keep when the row must end.
        res: the row's counts and, at the end, its new ids. done: the row has ended (it leaves the batch).
        run: the policy's per-decode state for this row (None: a stateless policy).
    """

    ids: list[int]
    prompt_len: int
    max_new: int
    seed: int
    stop_check: Callable[[list[int]], int | None] | None
    res: GenerationResult = field(default_factory=lambda: GenerationResult(torch.empty(0, dtype=torch.long)))
    done: bool = False
    run: PolicyRun | None = None

    @property
    def generated(self) -> int:
        return len(self.ids) - self.prompt_len

    def commit(
        self, cands: list[int], tau: int, nxt: int, eos: set[int], draft_calls: int, copied: bool = False
    ) -> None:
        """Commit a verified round: the first `tau` candidates and the token `nxt`, cut at an EOS or by the
        stop check; the round's counts (its `draft_calls` batched draft forwards, every row's); the policy
        run's update from (drafted, accepted), unless the round was a copy of the context (`copied`: the
        policy did not run it, `acchead.inference.batched_copy`)."""
        new = [*cands[:tau], nxt]
        cut = next((i for i, t in enumerate(new) if t in eos), None)
        if cut is not None:
            new, self.done = new[: cut + 1], True
        if self.stop_check is not None and (keep_n := self.stop_check(new)) is not None:
            new, self.done = new[:keep_n], True
        self.ids += new
        num, res = len(cands), self.res
        res.rounds += 1
        res.draft_calls += draft_calls
        res.drafted += num
        res.discarded += num - tau
        res.accepted_per_round.append(tau)
        res.drafted_per_round.append(num)
        res.copied_rounds += int(copied)
        if self.run is not None and not copied:
            self.run.end_round(num, tau)
        self.done = self.done or self.generated >= self.max_new


def make_rows(
    prompts: Sequence[torch.Tensor | Sequence[int]],
    max_new_tokens: int | Sequence[int],
    seed: int | Sequence[int],
    stop_checks: Sequence[Callable[[list[int]], int | None] | None] | None,
    models: list,
    start_run: Callable[[], PolicyRun] | None,
) -> list[Row]:
    """One `Row` per prompt ((T_b,) ids), `BatchedDecoder.generate`'s arguments checked (one line each):
    `max_new_tokens` and `seed` take one value for all rows or one per row (an int seed gives row b
    `seed + b`); `start_run` makes a row's per-decode policy state (AdaEDL's λ), None for none."""
    batch = len(prompts)
    if batch == 0:
        raise AccheadError("generate needs at least one prompt")
    max_new = [max_new_tokens] * batch if isinstance(max_new_tokens, int) else list(max_new_tokens)
    seeds = [seed + b for b in range(batch)] if isinstance(seed, int) else list(seed)
    checks = list(stop_checks) if stop_checks is not None else [None] * batch
    if not len(max_new) == len(seeds) == len(checks) == batch:
        raise AccheadError(f"need one max_new_tokens, seed and stop check per prompt ({batch})")
    rows = []
    for b, p in enumerate(prompts):
        ids = torch.as_tensor(p, dtype=torch.long).cpu().reshape(-1)
        if ids.numel() == 0 or max_new[b] < 1:
            raise AccheadError(f"prompt {b}: need a non-empty prompt and max_new_tokens >= 1")
        check_prompt(ids, max_new[b], models)
        run = start_run() if start_run is not None else None
        rows.append(Row(ids.tolist(), ids.numel(), max_new[b], seeds[b], checks[b], run=run))
    return rows


def round_verdicts(
    verify: Callable, vocab: int, rows: list[Row], cands: list[list[int]], qs: list[torch.Tensor | None],
    logits: torch.Tensor, sampling: SamplingConfig,
) -> list[tuple[int, int]]:  # fmt: skip
    """Each row's (τ, next token) from the round's logits ((R, L+1, V), row b's last len(cands[b]) + 1
    positions its own): under greedy decoding (one-hot p and q) the longest agreeing prefix, then the target's
    argmax; else `verify_sampled`'s, every row at once, read back in one transfer."""
    if not sampling.greedy:
        sampled = verify_sampled(verify, vocab, rows, cands, qs, logits, sampling).tolist()
        return [(tau, nxt) for tau, nxt in sampled]
    argmax, out = logits.argmax(-1).tolist(), []
    for a, c in zip(argmax, cands, strict=True):
        a = a[len(a) - len(c) - 1 :]
        tau = next((i for i in range(len(c)) if c[i] != a[i]), len(c))
        out.append((tau, a[tau]))
    return out


def verify_sampled(
    verify: Callable, vocab: int, rows: list[Row], cands: list[list[int]], qs: list[torch.Tensor | None],
    logits: torch.Tensor, sampling: SamplingConfig,
) -> torch.Tensor:  # fmt: skip
    """(R, 2) every row's (τ, next token) from the verifier `verify` (`acchead.inference.verification`), all
    rows in one vectorised call: each row's candidates padded to the longest L (`num`: the padded slots are
    rejected, and each draw is the one the row alone makes: the race's exponentials depend on the key and
    the slot only). logits: (R, L+1, V), row b's last len(cands[b]) + 1 positions its own; qs[b]: (L_b, V_q)
    the row's draft distributions (None: a model-free drafter), zero-padded to the target's `vocab`."""
    dev = logits.device
    width = logits.shape[1]  # L + 1

    def padded_q(q: torch.Tensor | None, num: int) -> torch.Tensor:  # (L, V) on the target's device
        if q is None:
            return torch.zeros(width - 1, vocab, device=dev)
        q = q.to(device=dev, dtype=torch.float32)
        q = F.pad(q, (0, vocab - q.shape[-1])) if q.shape[-1] < vocab else q
        return F.pad(q, (0, 0, 0, width - 1 - num))

    nums = torch.tensor([len(c) for c in cands], device=dev)
    tokens = torch.tensor([c + [0] * (width - 1 - len(c)) for c in cands], dtype=torch.long, device=dev)
    q = torch.stack([padded_q(qb, len(c)) for qb, c in zip(qs, cands, strict=True)])  # (R, L, V), 0 past num
    # Row b's p rows moved to the front: position i reads logits[b, L - num_b + i] (clamped: the rows
    # past num_b + 1 are never read by the laws).
    index = (torch.arange(width, device=dev)[None] + width - 1 - nums[:, None]).clamp_max(width - 1)
    p = probs_from_logits(logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1])), sampling)
    seeds = torch.tensor([r.seed for r in rows], device=dev)
    n = torch.tensor([len(r.ids) for r in rows], device=dev)
    keys = key_hash(seeds, TAU, n, 0), key_hash(seeds, NEXT, n, 0)
    batched = torch.func.vmap(lambda t, qq, pp, kt, kn, m: verify(t, qq, pp, False, kt, kn, m))
    return torch.stack(batched(tokens, q, p, *keys, nums), dim=1)
