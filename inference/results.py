"""What a decode returns: the tokens and the counts of the cost model (DESIGN §4), per sequence
(`GenerationResult`, from `SpeculativeDecoder.generate`) and per batch (`BatchResult`, from
`BatchedDecoder.generate`: one `GenerationResult` per row plus the batch's own forwards).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch


@dataclass
class GenerationResult:
    """New tokens and the counts of the cost model (DESIGN §4) for one `generate` call.

    Attributes:
        new_ids: (N,) int64 on the CPU, the generated tokens (EOS included if it ended the generation).
        target_calls: target forwards (= rounds).
        draft_calls: draft forwards (0 for model-free drafters and autoregressive decoding).
        drafted: candidates sent to the target.
        discarded: candidates the target rejected (drafted − accepted).
        rounds: verification rounds.
        accepted_per_round / drafted_per_round: per-round τ and L.
        wall_time: seconds spent in `generate` (excluding the oracle's hindsight reference run).
        head_calls: acceptance-head evaluations (SpecDec++ only).
        host_reads: device-to-host reads made by the decoding loop (`acchead.inference.host_reads`).
        copied_rounds: rounds whose candidates were copied from the context (`copy+POLICY`; no draft forward).
        phases: with `generate(..., profile=True)`, per round: "draft_ms" (drafting, all its forwards and
            stop decisions), "draft_forwards", "verify_ms" (target forward, verification, the status read
            and both rollbacks) and "verify_tokens" (tokens the target's forward fed); else empty.
    """

    new_ids: torch.Tensor
    target_calls: int = 0
    draft_calls: int = 0
    drafted: int = 0
    discarded: int = 0
    rounds: int = 0
    accepted_per_round: list[int] = field(default_factory=list)
    drafted_per_round: list[int] = field(default_factory=list)
    wall_time: float = 0.0
    head_calls: int = 0
    host_reads: int = 0
    copied_rounds: int = 0
    phases: dict[str, list[float]] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        """N, the number of generated tokens."""
        return int(self.new_ids.numel())

    @property
    def verification_rate(self) -> float:
        """N_target / N (lower is better; 1 for autoregressive decoding)."""
        return self.target_calls / max(self.tokens, 1)

    @property
    def discard_rate(self) -> float:
        """N_discarded / N."""
        return self.discarded / max(self.tokens, 1)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["new_ids"] = self.new_ids.tolist()
        d.update(tokens=self.tokens, verification_rate=self.verification_rate, discard_rate=self.discard_rate)
        return d


@dataclass
class BatchResult:
    """The rows' results and the batch's counts.

    Attributes:
        rows: one `GenerationResult` per prompt, in order: its tokens, its rounds (= its target_calls: the
            batched target forwards it took part in), the batched draft forwards of those rounds, its
            drafted/discarded counts and per-round τ and L.
        target_calls / draft_calls: batched target / draft forwards.
        head_calls: head evaluations (rows × judged steps).
        batch_stops: rounds the batch rule ended (0 without it).
        gate_rounds: rounds the round gate decoded autoregressively (`acchead.inference.round_gate`).
        gate_cap / gate_explored: the candidate cap the round gate ran at the decode's end (0: closed; its
            open cap where it stayed open) and whether the decode explored; None / False without a gate.
        wall_time: seconds in `generate`.
        round_times / round_draft_calls: per round, its wall seconds (its drafting, verification and
            bookkeeping; the first round holds the prompts' prefill) and its batched draft forwards
            (`acchead.inference.batch_cost` fits a draft step's price from the rounds of every row:
            `round_rows`).
    """

    rows: list[GenerationResult]
    target_calls: int = 0
    draft_calls: int = 0
    head_calls: int = 0
    batch_stops: int = 0
    gate_rounds: int = 0
    gate_cap: int | None = None
    gate_explored: bool = False
    wall_time: float = 0.0
    round_times: list[float] = field(default_factory=list)
    round_draft_calls: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.rows)

    @property
    def copied_rounds(self) -> int:
        """Rows' rounds whose candidates were copied from the context (`acchead.inference.batched_copy`)."""
        return sum(r.copied_rounds for r in self.rows)

    @property
    def round_rows(self) -> list[int]:
        """Per round, the rows it decoded: a row takes part in every round until it finishes (on the eager
        path it then leaves the batch), so round i had the rows of more than i rounds."""
        return [sum(r.rounds > i for r in self.rows) for i in range(self.target_calls)]

    @property
    def wall_tokens_per_s(self) -> float:
        return self.tokens / self.wall_time if self.wall_time > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": [r.to_dict() for r in self.rows], "target_calls": self.target_calls,
            "draft_calls": self.draft_calls, "head_calls": self.head_calls, "batch_stops": self.batch_stops,
            "gate_rounds": self.gate_rounds, "copied_rounds": self.copied_rounds, "wall_time": self.wall_time,
            "tokens": self.tokens,
            "wall_tokens_per_s": self.wall_tokens_per_s,
        }  # fmt: skip
