"""Batched speculative decoding: B prompts at once, per-row acceptance and per-row adaptive stopping.

`SpeculativeDecoder` decodes one prompt; `BatchedDecoder` decodes B prompts in lockstep rounds, with the
same drafter/policy/verifier algorithm per row (DESIGN §4) and these batch-level choices:

- Ragged rows share one KV cache per model (`acchead.inference.ragged_cache.RaggedCache`): prompts are
  left-padded with masked holes, every later token takes a new slot, and a row's rejected candidates
  become masked holes instead of being cropped, so each row rolls back on its own without moving another
  row's keys. Position ids are per row. Hence every row computes exactly what it would alone, up to
  float rounding of other batch shapes (tests/test_batched.py: greedy rows equal `generate` on the
  prompt alone).
- A round: every row drafts up to its own stop (its cap = the policy's, bounded by the row's remaining
  tokens; SpecDec++: its own P̂ threshold h, a vote under a batch rule: `batched_step`). One draft
  forward per step serves every row; rows that stopped wait masked (they feed a hole). Then ONE target
  forward verifies every row's candidates (fed right-aligned, padded to the longest), each row with the
  verifiers (`acchead.inference.verification`, token or block) under its own keys; greedy, both reduce
  to "longest agreeing prefix, then the target's argmax", computed for all rows from one argmax.
- With `batch_stop` (SpecDec++ only), the batch also stops drafting as a whole once one more draft forward
  costs more than the rows still drafting are expected to gain (`acchead.inference.batch_stop`,
  docs/batched.md). Rows that stop on this rule get the SpecDec++ free token like a row-level stop. Its
  gated form caps each round's candidates, 0 included, before it starts (`acchead.inference.round_gate`).
- Rows that finish (EOS, their max tokens, their stop check) leave the batch (`batch_select_indices`;
  on the fast path, `acchead.inference.static_ragged_cache`, they stay as all-hole rows: one graph per B).
  A batch of one runs on the single-prompt decoder instead (`acchead.inference.batched_single`).
- A feature draft (EAGLE) drafts from the target's states, which the verification hands each row
  for the positions it accepted (`acchead.inference.batched_feed`).
- With copy rounds, a row whose context's suffix recurs copies what followed it instead of drafting, while
  the other rows draft (`acchead.inference.batched_copy`).

Randomness: row b draws with the keys the single-prompt decoder uses with seed `seeds[b]` (seed + b by
default): draft sample k of a round starting at n is keyed (seed_b, DRAFT, n, k), τ and the next token
(seed_b, TAU/NEXT, n, 0). So without the batch rule a row's tokens equal `SpeculativeDecoder.generate(
prompt_b, seed=seed_b)` up to float ties, and every row is an exact sample from the target (chi-square in
tests/test_batched.py). Policies: autoregressive, specdec:k=K, specdecpp, confidence, entropy, adaedl.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import torch
from transformers import PreTrainedModel

from acchead.errors import AccheadError
from acchead.feature_draft import is_feature_draft
from acchead.head import AcceptanceHead
from acchead.head_io import load_head
from acchead.inference.adaedl import AdaEDL
from acchead.inference.batch_cost import BatchCosts, calibration_sizes, measure_batch_costs, measured_costs
from acchead.inference.batch_stop import BatchStop, parse_batch_stop
from acchead.inference.batched_copy import merge_copies, plan_copies
from acchead.inference.batched_feed import FeatureFeed, TokenFeed
from acchead.inference.batched_rows import Row, make_rows, round_verdicts
from acchead.inference.batched_single import SingleRow
from acchead.inference.batched_step import StepIndex, StepRule, run_draft_steps, step_posts
from acchead.inference.device_path import DevicePath
from acchead.inference.drafter_spec import CopySpec
from acchead.inference.policies import Autoregressive, Confidence, Entropy, FixedK, StopPolicy
from acchead.inference.policy_build import parse_policy
from acchead.inference.policy_spec import PolicySpec
from acchead.inference.ragged_cache import Post, RaggedCache, right_aligned
from acchead.inference.results import BatchResult
from acchead.inference.round_gate import GateMemory, draft_prefill_rounds
from acchead.inference.spec import DecodingSpec, spec_arguments, take_copy_rounds
from acchead.inference.specdecpp_policy import SpecDecPP
from acchead.inference.static_ragged_cache import StaticRaggedCache, ragged_cache
from acchead.inference.units import FEED, SAMPLE
from acchead.inference.verification import VERIFIERS
from acchead.models import output_embedding_table
from acchead.sampling import SamplingConfig


class BatchedDecoder:
    """Speculative decoding of B prompts at once (see the module docstring).

    Args:
        target: the target causal LM (eval mode).
        draft: the draft causal LM, or None for `autoregressive`.
        policy: "autoregressive", "specdec:k=K", "specdecpp[:h=..,max=..,free=..]", "confidence:tau=..",
            "entropy:tau=..", "adaedl:lam=..[,adapt=0]" (each row its own λ) or such a `StopPolicy` (not
            the bandits: they choose a policy per round for one sequence).
        head: for specdecpp: an `AcceptanceHead` or a head file (loaded with the draft check).
        verifier: "token" or "block".
        batch_stop: the batch-level stop rule (specdecpp only): False (rows stop on their own only), True
            (cost ratio c = 1 − h, which adds nothing at B = 1), a float c, "measured" (c(B) timed on
            this machine at the batch sizes `generate` meets: `calibrate`), or a `BatchStop`.
        spec: a `DecodingSpec` (or its string) in place of policy, head, verifier and fast.
        fast: the batched fast path (`acchead.inference.static_ragged_cache`: static caches, one compiled
            forward per (B, width)) for the target and the draft; None or False: eager `DynamicCache`s.
        compile: False runs the fast path's static caches eagerly (tests: the same logic in seconds).
        device_path: compile the fast path's forwards as the CUDA default does (`DevicePath`); None: on
            CUDA only.
        single: a batch of one prompt runs on the single-prompt decoder (`acchead.inference.batched_single`:
            the same tokens, faster); False: on the batched rounds (their tests; the batch rule's timers).
        copy: copy rounds per row where its context's suffix recurs, the policy's rounds elsewhere
            (`acchead.inference.batched_copy`); or name them in `spec` ("copy+specdec:k=2").
    """

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel | None = None,
        policy: str | PolicySpec | StopPolicy | None = None,  # None: "specdec:k=4"
        head: AcceptanceHead | str | Path | None = None,
        verifier: str | None = None,  # None: "token"
        batch_stop: bool | float | str | BatchStop | None = False,
        spec: DecodingSpec | str | None = None,
        fast: bool | None = None,
        compile: bool = True,
        device_path: bool | DevicePath | None = None,
        single: bool = True,
        copy: CopySpec | None = None,
    ) -> None:
        spec, copy = take_copy_rounds(spec, copy)
        policy, head, verifier, fast = spec_arguments(spec, policy, head, verifier, fast)
        if head is not None and not isinstance(head, AcceptanceHead):
            head, _ = load_head(head, draft=draft)
        self.policy = policy if isinstance(policy, StopPolicy) else parse_policy(policy, head=head)
        batchable = Autoregressive | FixedK | SpecDecPP | Confidence | Entropy | AdaEDL
        if not isinstance(self.policy, batchable):
            raise AccheadError("batched decoding runs autoregressive, specdec, specdecpp, confidence, "
                               f"entropy and adaedl, not {self.policy.spec!r}")  # fmt: skip
        if draft is None and not isinstance(self.policy, Autoregressive):
            raise AccheadError(f"policy {self.policy.spec!r} needs a draft model")
        if copy is not None and (draft is None or isinstance(self.policy, Autoregressive)):
            raise AccheadError("copy rounds wrap a draft model's rounds: pass a draft model and its policy")
        if head is not None and "depth" in head.inputs:  # not built yet
            raise AccheadError("batched decoding takes no head reading 'depth'")
        if isinstance(self.policy, SpecDecPP) and self.policy.priced:  # the batch rule prices batches
            raise AccheadError("batched decoding takes no priced=1 policy: batch_stop prices a batch's steps")
        self.target, self.draft, self.verifier = target, draft, verifier
        self._verify = VERIFIERS[verifier]
        self._vocab = target.get_output_embeddings().weight.shape[0]
        self.fast = bool(fast)

        def cache(model: PreTrainedModel) -> RaggedCache | StaticRaggedCache:
            return ragged_cache(model, compile, device_path) if self.fast else RaggedCache(model)

        self.t_cache = cache(target)
        # a feature draft with fused layers reads those layers' outputs beside the target's final states
        self._fused = tuple(draft.config.fused_layers) if is_feature_draft(draft) else ()
        feed = FeatureFeed if is_feature_draft(draft) else TokenFeed
        drafts = draft is not None and not isinstance(self.policy, Autoregressive)  # AR: no draft cache
        self._feed = feed(cache(draft)) if drafts else None
        # the widest round start the fast path compiles (1-2 ids; a feature draft's cap + 1 pairs): a row
        # lacking more after copy rounds is fed the rest first, uncompiled (`TokenFeed.start`)
        self._catch_up = None if not self.fast else self.policy.max_cap + 1 if feed is FeatureFeed else 2
        pp = self.policy if isinstance(self.policy, SpecDecPP) else None
        if not isinstance(batch_stop, BatchStop):
            batch_stop = parse_batch_stop(batch_stop, pp.h if pp else None)
        if batch_stop is not None and pp is None:  # a ratio c too: no rule is silently left unused
            raise AccheadError("the batch stop rule reads the heads' P̂: it needs a specdecpp policy")
        self.batch_stop: BatchStop | None = batch_stop
        if copy is not None and batch_stop is not None and batch_stop.gate:  # its gains read drafted rounds
            raise AccheadError("copy rounds take no gated batch rule: use batch_stop='measured'")
        self.copy = copy
        self._rule = StepRule()  # what a draft step decides with (`acchead.inference.batched_step`)
        if pp is not None and draft is not None:
            pp.head.to(draft.device)
            emb = output_embedding_table(draft) if pp.lookahead and "token" in pp.head.inputs else None
            self._rule = StepRule(SAMPLE if pp.lookahead else FEED, pp.head, free=pp.free_token,
                                  lockstep=batch_stop is not None, out_emb=emb)  # fmt: skip
        elif isinstance(self.policy, Confidence | Entropy | AdaEDL):
            self._rule = StepRule(row_policy=self.policy)
        self._ks = StepIndex()  # k as graph inputs
        self._gates = GateMemory()  # a gated batch rule's round gates, decode after decode
        self._single = SingleRow(target, draft, self.policy, verifier, self.fast, compile, device_path, copy)
        self.single = single  # a batch of one runs on `_single`

    @property
    def cap(self) -> int:
        """The policy's candidate cap per round."""
        return self.policy.max_cap

    def widest(self, batch: int) -> int:
        """The most candidates a round of `batch` rows verifies: the cap, or a copy (`CopySpec.row_block`)."""
        return max(self.cap, self.copy.row_block(batch) if self.copy is not None else 0)

    def _span(self, lengths: Sequence[int]) -> int:
        """Slots a static cache needs for rows of at most these total lengths plus one round's feed (on the
        fast path padded to its graph's width)."""
        room = self.widest(len(lengths)) + 2
        if self.fast:  # the draft's feeds are never wider than the target's
            room = self.t_cache.graph_width(room)
        return max(lengths) + room

    @torch.inference_mode()
    def warm_up(
        self, batch: int, length: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0
    ) -> float:
        """Compile the fast path's forwards of `batch` rows of up to `length` tokens (prompt and new) before
        a timed decode: every width a round can feed each model, the draft's with the round's step under
        this S (part of its graph: warm up each S you time). Seconds spent; 0 on the eager path."""
        if not self.fast:
            return 0.0
        try:
            sampling = SamplingConfig(float(temperature), int(top_k), float(top_p))
        except ValueError as e:
            raise AccheadError(str(e)) from None
        start = time.perf_counter()
        if batch == 1 and self.single:  # the single-prompt decoder's units at its h' (a measured c(1) first)
            self._calibrated(1)
            self._single.warm_up(self.batch_stop, length, temperature, top_k, top_p)
            return time.perf_counter() - start
        span = self._span([length] * batch)
        widths = self.t_cache.graph_widths(self.widest(batch) + 1)  # a round feeds 1..widest + 1 tokens
        states = self._feed is not None and self._feed.wants_target_states
        shapes = [(w, w, states, w, False, None) for w in widths]
        if states and self.batch_stop is not None and self.batch_stop.gate:  # a closed gate's: no states
            shapes.append((1, 1, False, 1, False, None))
        self.t_cache.warm_up(batch, span, shapes, self._fused)
        if self._feed is not None and self.cap > 0:
            want = self._rule.head is not None
            lams = [0.5] * batch if isinstance(self.policy, AdaEDL) else None
            post = self._posts([self.cap] * batch, [0] * batch, [1] * batch, lams, -1.0, sampling,
                                   self._feed.cache.device)(1)  # a graph of any bound serves every bound
            if self._feed.wants_target_states:  # a round start feeds the pairs of the accepted tokens
                shapes = [(w, 1, True, 1, True, post) for w in self._feed.cache.graph_widths(self.cap + 1)]
            else:  # the committed tail: 1 or 2 ids (a step feeds 1)
                shapes = [(w, 1, want, 1, False, post) for w in (1, 2)]
            self._feed.cache.warm_up(batch, span, shapes)
        return time.perf_counter() - start

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[torch.Tensor | Sequence[int]],
        max_new_tokens: int | Sequence[int] = 128,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | Sequence[int] = 0,
        eos_token_id: int | list[int] | None = None,
        stop_checks: Sequence[Callable[[list[int]], int | None] | None] | None = None,
    ) -> BatchResult:
        """Decode every prompt ((T_b,) ids each, any lengths) up to its max new tokens, EOS or stop check.

        `max_new_tokens` and `seed` take one value for all rows or one per row (an int seed gives row b the
        seed `seed + b`). `stop_checks[b]`, as `SpeculativeDecoder.generate`'s `stop_check`, is called with
        row b's new tokens after each of its rounds and returns how many to keep when the row must end.
        """
        batch = len(prompts)
        try:
            sampling = SamplingConfig(float(temperature), int(top_k), float(top_p))
        except ValueError as e:
            raise AccheadError(str(e)) from None
        models = [m for m in (self.target, self.draft) if m is not None]
        start_run = self.policy.start_decode if isinstance(self.policy, AdaEDL) else None  # each row its λ
        rows = make_rows(prompts, max_new_tokens, seed, stop_checks, models, start_run)
        eos = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id or ())
        self._calibrated(batch)  # not part of the decode's wall time
        if batch == 1 and self.single:
            return self._single.generate(rows[0], self.batch_stop, temperature, top_k, top_p, eos_token_id)
        out = BatchResult(rows=[r.res for r in rows])
        start = time.perf_counter()
        # the fast path's static caches: room for the longest row and a round's candidates without compacting
        span = self._span([r.prompt_len + r.max_new for r in rows])
        self.t_cache.reset(batch, span)
        if self._feed is not None:
            self._feed.reset(batch, span)
        prefill = draft_prefill_rounds(self._feed, sum(r.prompt_len for r in rows), self.batch_stop, batch)
        active, gate = rows, self._gates.start(self.batch_stop, self._rule.head, self.cap, batch, prefill)
        while active:
            limit = self.cap if gate is None else gate.cap(active)  # the round gate: 0 (AR) .. the cap
            caps = [min(limit, r.max_new - r.generated - 1) for r in active]
            if self._feed is not None and not self._feed.ready:  # a feature draft before the target's states
                caps = [0] * len(active)
            calls0, round_start = out.draft_calls, time.perf_counter()
            copies = plan_copies(active, self.copy, batch if self.fast else len(active))
            caps = [0 if c else k for c, k in zip(copies, caps, strict=True)]  # a copying row waits
            if max(caps) > 0:
                cands, qs = self._draft(active, caps, sampling, out)
            else:
                cands, qs = [[] for _ in active], [None] * len(active)
            cands, qs = merge_copies(copies, cands, qs, self._vocab, sampling, self.t_cache.device)
            closed = gate is not None and gate.closed  # the draft is left behind
            out.gate_rounds += int(closed)
            self._verify_round(active, cands, qs, sampling, eos, out.draft_calls - calls0, closed, copies)
            if gate is not None:
                gate.ran(out.draft_calls - calls0, active)
            out.target_calls += 1
            # the round ended on a host read (its tokens), so on a GPU too this clock has waited for it
            out.round_times.append(time.perf_counter() - round_start)
            out.round_draft_calls.append(out.draft_calls - calls0)
            keep = [i for i, r in enumerate(active) if not r.done]
            if len(keep) < len(active):
                idx = torch.tensor(keep, dtype=torch.long)
                self.t_cache.select(idx.to(self.t_cache.device))
                if self._feed is not None:
                    self._feed.select(idx)
                active = [active[i] for i in keep]
        if gate is not None:
            out.gate_cap, out.gate_explored = self._gates.remember(gate)
        for r in rows:
            r.res.new_ids = torch.tensor(r.ids[r.prompt_len :], dtype=torch.long)
            r.res.target_calls = r.res.rounds
        out.wall_time = time.perf_counter() - start
        return out

    def _calibrated(self, batch: int) -> None:
        """A measured rule's c(B) up to `batch` rows: `calibrate` once per larger batch than any measured."""
        rule = self.batch_stop
        if rule is not None and rule.measure and (rule.costs is None or batch > rule.costs.costs[-1].batch):
            self.calibrate(batch)

    def calibrate(self, batch: int) -> BatchCosts:
        """Measure the batch rule's c(B) at 1, 4, 16, ... and `batch` rows by timing this target and draft's
        autoregressive, K = 1, 2 and 3 rounds (`acchead.inference.batch_cost`; B = 1 on the single-prompt
        decoder when it runs batches of one), keeping the sizes measured before by any decoder of this pair
        and path (`measured_costs`); `generate` calls it when a batch is larger than any measured."""
        rule = self.batch_stop
        if rule is None or not rule.measure:  # a measured rule implies specdecpp, hence a draft
            raise AccheadError("calibrate needs batch_stop='measured'")
        path = ("fast" if self.fast else "eager") + ("+single" if self.single else "")
        shared = measured_costs(self.target, self.draft, path)
        have = shared | ({c.batch: c for c in rule.costs.costs} if rule.costs is not None else {})
        sizes = [b for b in calibration_sizes(batch) if b not in have]
        new: tuple = ()
        if sizes:
            timers = {name: BatchedDecoder(self.target, None if k is None else self.draft, spec)
                      for name, k, spec in (("ar", None, "autoregressive"), ("k1", 1, "specdec:k=1"),
                                            ("k2", 2, "specdec:k=2"), ("k3", 3, "specdec:k=3"))}  # fmt: skip
            for timer in timers.values():  # the same caches (on the fast path: the same compiled graphs)
                timer.t_cache, timer.fast, timer.single = self.t_cache, self.fast, self.single
                timer._single = self._single.timer(timer.draft, timer.policy)
                if timer._feed is not None:
                    timer._feed = self._feed
            new = measure_batch_costs(timers, self._vocab, sizes).costs
            shared.update({c.batch: c for c in new})
        self.batch_stop = replace(rule, costs=BatchCosts((*have.values(), *new)))
        assert self.batch_stop is not None and self.batch_stop.costs is not None
        return self.batch_stop.costs

    # ------------------------------------------------------------------------------------------- drafting

    def _draft(
        self, rows: list[Row], caps: list[int], sampling: SamplingConfig, out: BatchResult
    ) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        """One round's drafting for every row: ([candidates of row b], [(L_b, V) their q or None]), each
        draft forward running the round's step (`acchead.inference.batched_step.draft_step`: draws, stop
        rules, the batch rule) in its own unit."""
        feed = self._feed
        assert feed is not None
        dev, want = feed.cache.device, self._rule.head is not None  # want: a head reads each step's state
        lams = [r.run.lam for r in rows] if isinstance(self.policy, AdaEDL) else None  # moved between rounds
        bound = -1.0  # the batch rule's c(R)·R over the R rows of the round; −1: never stops the batch
        if self.batch_stop is not None and self._rule.head is not None:
            bound = self.batch_stop.bound(len(rows))
        seeds, starts = [r.seed for r in rows], [len(r.ids) for r in rows]
        post = self._posts(caps, seeds, starts, lams, bound, sampling, dev)
        return run_draft_steps(feed, [r.ids for r in rows], want, post, self._catch_up, out)

    def _posts(
        self, caps: list[int], seeds: list[int], starts: list[int], lams: list[float] | None, bound: float,
        sampling: SamplingConfig, dev: torch.device,
    ) -> Callable[..., Post]:  # fmt: skip
        """`step_posts` for this decoder's threshold, step rule and k tensors."""
        pp = self.policy if isinstance(self.policy, SpecDecPP) else None
        return step_posts(caps, seeds, starts, lams, pp.h if pp else None, bound, self._rule, sampling, dev,
                          self._ks)  # fmt: skip

    # ------------------------------------------------------------------------------------------ verifying

    def _verify_round(
        self, rows: list[Row], cands: list[list[int]], qs: list[torch.Tensor | None],
        sampling: SamplingConfig, eos: set[int], draft_calls: int, closed: bool = False,
        copies: list[list[int]] | None = None,
    ) -> None:  # fmt: skip
        """One batched target forward over every row's [committed tail, candidates]; per-row verification,
        commit and rollback of both caches (the target's alone once the round gate `closed`). `copies`: the
        rows whose candidates were copied (non-empty), not drafted."""
        cache = self.t_cache
        dev = cache.device
        held = cache.length.tolist()
        feeds = [r.ids[h:] + c for r, h, c in zip(rows, held, cands, strict=True)]
        keep = max(len(c) for c in cands) + 1
        states = self._feed is not None and self._feed.wants_target_states and not closed
        tokens, counts = right_aligned(feeds, dev)
        width = tokens.shape[1]  # the states of every fed position: a feature draft reads the accepted ones
        logits, hidden = cache.feed(tokens, counts, keep=keep, want_hidden=states, hidden_rows=width,
                                    state_layers=self._fused if states else ())  # fmt: skip
        kept = []
        verdicts = round_verdicts(self._verify, self._vocab, rows, cands, qs, logits, sampling)
        for b, (r, c, (tau, nxt)) in enumerate(zip(rows, cands, verdicts, strict=True)):
            n = len(r.ids)
            r.commit(c, tau, nxt, eos, draft_calls, copied=bool(copies and copies[b]))
            kept.append(n + tau)
            if states:  # the target's states of the positions it accepted: held .. n + tau - 1
                first = width - len(feeds[b])
                self._feed.observe(b, hidden[b, first : first + n + tau - held[b]])
        kept_t = torch.tensor(kept, device=dev)
        # A static cache's rollback only masks rejected slots: skipped when there are none (the eager
        # cache's also crops and compacts its holes)
        if not self.fast or any(k < h + len(f) for k, h, f in zip(kept, held, feeds, strict=True)):
            cache.rollback(kept_t)
        if self._feed is not None and not closed:
            self._feed.commit(kept_t)
