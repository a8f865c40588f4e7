"""The speculative decoder: a drafter proposes, a stop policy ends the round, one target forward verifies.

One sequence per decode (B prompts at once: `acchead.inference.batched.BatchedDecoder`).

One round, with n tokens committed (prompt + generated) and the target's cache holding the first n − 1:
    1. candidates X_1..X_L from the drafter, L chosen online by the policy (DESIGN §4);
    2. ONE target forward over [x_n, X_1..X_L] gives p_1..p_{L+1} (= S(target logits), the same
       `probs_from_logits` gen-data uses);
    3. the verifier keeps τ candidates and emits one more token (correction or bonus);
    4. both caches are rolled back to the n + τ tokens they share with the new sequence.
Output is distributed exactly as the target's under S (greedy: token-for-token the target's greedy
decoding), whatever the policy, because the policy only sees the past (tests/test_exactness.py).

Two paths run the models (`acchead.inference.model_runner`): eager (`DynamicCache`, cropped) and fast
(`fast=True`: static caches, rollback by moving a position, every unit compiled once and replayed; CUDA
graphs on a GPU). A unit is a forward with what its output feeds (`acchead.inference.units`): a draft step
(S, the draw, the stop rule), a fixed-K round's K draft steps, a verification (S, the verifier, the packed
status). One loop and the same unit functions run both paths, eager or compiled; same algorithm, same
counts. The fast path is the default on CUDA; on the CPU it is opt-in: it pays tens of seconds of
compilation per model before its first decode (`warm_up`, once per S).

The round's state lives on the target's device: the sequence, the candidates and their q, the verifier's
τ and next token (drawn with counter-based noise keyed by (seed, round start), so the same seed gives the
same tokens eagerly, compiled, on the CPU and on CUDA). The host reads back, through
`acchead.inference.host_reads.read`, one packed status per round (τ, next token, candidates: what EOS, the
streamer and the cache lengths need) and, for threshold rules, one stop flag per judged candidate. An EOS
candidate does not end drafting (that check would cost a read per candidate); tokens after an accepted
EOS are cut after verification, which keeps the output exact: a target sample cut at its first EOS is the
EOS-terminated sample. Host-driven parts, which read where they compute: the Max-Gram drafter and
cascades (their proposals are host computations over the context) and the oracle's hindsight reference.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

import acchead.inference.host_reads as host_reads
from acchead.errors import AccheadError
from acchead.feature_draft import is_feature_draft
from acchead.head import AcceptanceHead
from acchead.inference.bandit_policy import BanditPolicy
from acchead.inference.copy_drafter import CopyDrafter
from acchead.inference.device_path import DevicePath, PhaseClock, upload
from acchead.inference.draft_round import draft_round
from acchead.inference.drafter_spec import CopySpec
from acchead.inference.drafters import Drafter, ModelDrafter
from acchead.inference.feature_drafter import FeatureDrafter
from acchead.inference.host_reads import read
from acchead.inference.model_runner import make_runner
from acchead.inference.oracle_reference import oracle_reference
from acchead.inference.policies import Autoregressive, PolicyRun, StopPolicy
from acchead.inference.policy_build import parse_policy
from acchead.inference.policy_spec import PolicySpec
from acchead.inference.results import GenerationResult
from acchead.inference.round_verifier import RoundVerifier
from acchead.inference.spec import DecodingSpec, needs_head, spec_arguments, take_copy_rounds
from acchead.inference.verification import VERIFIERS
from acchead.models import check_prompt
from acchead.sampling import SamplingConfig


def _as_prompt(input_ids: torch.Tensor | list[int]) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long).cpu()
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise AccheadError(f"SpeculativeDecoder decodes one sequence at a time; got batch {ids.shape[0]}")
        ids = ids[0]
    if ids.dim() != 1 or ids.numel() == 0:
        raise AccheadError(f"input_ids must be a non-empty (T,) or (1, T) tensor, got {tuple(ids.shape)}")
    return ids


class SpeculativeDecoder:
    """Speculative decoding of `target` with a drafter, a stop policy and a verifier (batch size 1).

    Args:
        target: the target causal LM (eval mode).
        draft: the draft causal LM (wrapped in a `ModelDrafter` with its own KV cache; a feature draft,
            `acchead.feature_draft`, in a `FeatureDrafter`), or any `Drafter` (e.g. MaG, a cascade), or
            None for `autoregressive`.
        policy: a spec string (`acchead.inference.policy_spec`), its typed `PolicySpec`, or a `StopPolicy`.
        head: for `specdecpp`: an `AcceptanceHead`, or a path loaded with `acchead.load_head(path,
            draft=draft)` (a head trained for another draft is refused). Required: the decoder never picks
            one (the demo pair's shipped head for an S: `acchead.demo_pair.head_for(S)`).
        verifier: "token" (Leviathan/Chen) or "block" (Sun et al. 2024).
        fast: run the target (and a draft model given as a `PreTrainedModel`) on the fast path: static KV
            caches and compiled forwards (`acchead.inference.model_runner.StaticRunner`). None: on when
            the target is on CUDA, unless the draft is a feature (EAGLE) draft (opt-in: its units
            return the states it reads, `acchead.inference.feature_drafter`). Call `warm_up` before
            timing it.
        compile: on the fast path, capture the forwards (False runs the static caches eagerly: the same
            cache logic without compilation, for tests and debugging).
        device_path: take the CUDA default's branches (`acchead.inference.device_path`): the fast path and
            the fixed-K round unit by default, units compiled for CUDA-graph replay. None: on CUDA only;
            True on the CPU runs them there (how the CPU suite tests them); a `DevicePath` also picks the
            compile backend (`DevicePath(True, backend="cudagraphs")`: no Inductor).
        spec: a `DecodingSpec` (or its string) in place of policy, head, verifier and fast.
        copy: copy rounds where the context's suffix recurs, the draft model's rounds elsewhere
            (`acchead.inference.copy_drafter`; either path); or name them in `spec` ("copy+specdec:k=2").
    """

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel | Drafter | None = None,
        policy: str | PolicySpec | StopPolicy | None = None,  # None: "specdec:k=4"
        head: AcceptanceHead | str | Path | None = None,
        verifier: str | None = None,  # None: "token"
        fast: bool | None = None,
        compile: bool = True,
        device_path: bool | DevicePath | None = None,
        spec: DecodingSpec | str | None = None,
        copy: CopySpec | None = None,
    ) -> None:
        spec, copy = take_copy_rounds(spec, copy)
        policy, head, verifier, fast = spec_arguments(spec, policy, head, verifier, fast)
        self.target = target
        self.path = DevicePath.resolve(target.device, device_path)
        if fast is None:  # the device's default; with a feature draft eager (its fast path: opt-in)
            fast = self.path.fast_default and not is_feature_draft(draft)
        self.fast = bool(fast)
        if self.fast and draft is target:
            raise AccheadError("the fast path keeps one cache per model: pass distinct target and draft")
        self._runner = make_runner(target, self.fast, compile, device_path=self.path)
        # Resolved once: `PreTrainedModel.device` walks the parameters on every access.
        self._device: torch.device = target.device
        vocab = target.get_output_embeddings().weight.shape[0]  # the width of p
        self._verifier = RoundVerifier(
            self._runner, VERIFIERS[verifier], vocab, self._device, key_tensors=self.fast and compile,
            # the fast path pads each round to a verification width (a graph per width; the uncompiled
            # static runner too, so its tests run the padding); on the device path through Inductor the
            # longer widths share one symbolic graph, captured per width (on the CPU ~2x slower)
            padded=self.fast, symbolic=self.fast and compile and self.path.symbolic_shapes,
            state_layers=tuple(draft.config.fused_layers) if is_feature_draft(draft) else (),  # EAGLE-3's
        )
        if is_feature_draft(draft):
            draft = FeatureDrafter(draft, fast=self.fast, compile=compile, device_path=device_path)
        elif isinstance(draft, PreTrainedModel):
            # The draft resolves its own default from its own device (it may sit elsewhere).
            draft = ModelDrafter(draft, fast=self.fast, compile=compile, device_path=device_path)
        elif draft is not None and not isinstance(draft, Drafter):
            raise AccheadError(
                f"draft must be a PreTrainedModel, a Drafter (acchead.inference.drafters) or None, not "
                f"{type(draft).__name__}"
            )
        # The draft model, when there is one: the head is checked against it and the oracle runs it.
        self.draft_model = draft.model if isinstance(draft, ModelDrafter | FeatureDrafter) else None
        if copy is not None:
            if not isinstance(draft, FeatureDrafter | ModelDrafter):
                raise AccheadError("copy rounds wrap a draft model's rounds: pass a draft model")
            draft = CopyDrafter(draft, copy, vocab)
        self.drafter: Drafter | None = draft
        self.reads_states = draft is not None and draft.reads_target_states  # a feature drafter
        self.verifier = verifier
        self.head_meta = None
        self.policy_run: PolicyRun | None = None  # the policy's state in the last (or current) decode
        if not isinstance(policy, str | PolicySpec | StopPolicy):
            raise AccheadError(
                f"policy must be a spec string (e.g. 'specdec:k=4'), PolicySpec or StopPolicy: {policy!r}"
            )
        if head is None and not isinstance(policy, StopPolicy) and needs_head(policy):
            raise AccheadError(
                f"policy {policy!r} needs an acceptance head: pass head=PATH (the demo pair's shipped head "
                "for an S: acchead.demo_pair.head_for(S))"
            )
        self._set_policy(policy, head)
        if copy is not None and isinstance(self.policy, BanditPolicy):  # its arms would miss the copy rounds
            raise AccheadError("copy rounds run without the policy; a bandit's arms cannot share them")

    def _set_policy(
        self, policy: str | PolicySpec | StopPolicy, head: AcceptanceHead | str | Path | None
    ) -> None:
        head_module = self._resolve_head(head)
        if head_module is not None and self.fast and "depth" in head_module.inputs:
            # a compiled draft step would trace the candidate's index as a constant (a graph per depth)
            raise AccheadError("a head reading 'depth' runs on the eager path only: pass fast=False")
        self.policy = policy if isinstance(policy, StopPolicy) else parse_policy(policy, head=head_module)
        if self.drafter is None and not isinstance(self.policy, Autoregressive):
            raise AccheadError(f"policy {self.policy.spec!r} needs a draft model or drafter")
        if self.draft_model is not None:
            self.policy.to(self.draft_model.device)
            self.policy.attach_draft(self.draft_model)

    @property
    def _round_drafter(self) -> Drafter | None:
        """The drafter a decode drives: none under autoregressive decoding (no draft cache, no states)."""
        return None if isinstance(self.policy, Autoregressive) else self.drafter

    def _resolve_head(self, head: AcceptanceHead | str | Path | None) -> AcceptanceHead | None:
        if head is None:
            return None
        if not isinstance(head, AcceptanceHead):
            from acchead.head_io import load_head

            head, self.head_meta = load_head(head, draft=self.draft_model)
        elif not all(bool(p.isfinite().all()) for p in head.parameters()):
            raise AccheadError("the acceptance head's weights contain NaN or Inf; retrain the head")
        if self.draft_model is not None:
            hidden = self.draft_model.get_input_embeddings().weight.shape[1]
            if head.hidden_size != hidden:
                raise AccheadError(
                    f"the head reads hidden states of size {head.hidden_size}, the draft's are {hidden}"
                )
        return head

    def warm_up(self, max_length: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0) -> None:
        """Compile, on the fast path, every unit a decode of up to `max_length` tokens (prompt + new
        tokens) under this S can run: the target's verification of 0..cap candidates and the draft model's
        steps (with and without the stop rule). S is part of each unit (its processing and draw), so warm
        up each S you time. Without it each unit compiles on first use, inside a timed decode. Eager:
        nothing to do."""
        if not self.fast:
            return
        try:
            sampling = SamplingConfig(float(temperature), int(top_k), float(top_p))
        except ValueError as e:
            raise AccheadError(str(e)) from None
        with torch.inference_mode():
            # No cache holds more than prompt + new tokens (a round's cap leaves room for the target's).
            drafter, states = self._round_drafter, self._round_drafter is not None and self.reads_states
            cap = max(self.policy.max_cap, drafter.longest_round if drafter is not None else 0)  # or a copy
            self._verifier.warm_up(max_length, cap, sampling, states=states)
            self.policy.price_widths(self._verifier.fed_ms())  # a priced SpecDec++'s thresholds
            if drafter is not None:
                drafter.warm_up(max_length, sampling, self.policy.start_decode())

    # ------------------------------------------------------------------------------------------ generate

    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.Tensor | list[int],
        max_new_tokens: int = 128,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        eos_token_id: int | list[int] | None = None,
        streamer: Any = None,
        profile: bool = False,
        stop_check: Callable[[list[int]], int | None] | None = None,
    ) -> GenerationResult:
        """Decode up to `max_new_tokens` tokens after `input_ids` ((T,) or (1, T)).

        temperature 0 is greedy. `seed` fixes every random draw (the draft's samples and the verifier's),
        so a call is repeatable. Generation ends at `max_new_tokens` or after an EOS token. `streamer`
        gets the Hugging Face streamer calls (`put(prompt)`, then `put(new tokens)` per round, `end()`).
        `profile` times each round's drafting and verification into `GenerationResult.phases` (CUDA events
        on a GPU, so the timing adds no synchronisation). `stop_check`, called after each round with its new
        tokens (host ints, after EOS truncation), returns how many of them to keep when generation must
        end there, else None: how `acchead.inference.hf` applies transformers' stopping criteria.
        """
        prompt = _as_prompt(input_ids)
        try:
            sampling = SamplingConfig(float(temperature), int(top_k), float(top_p))
        except ValueError as e:
            raise AccheadError(str(e)) from None
        if max_new_tokens < 1:
            raise AccheadError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        # Out-of-vocabulary ids and prompt + max_new_tokens past the context: one line, not junk.
        check_prompt(prompt, max_new_tokens, [m for m in (self.target, self.draft_model) if m is not None])
        if self.policy.greedy_only and not sampling.greedy:
            raise AccheadError(
                f"policy {self.policy.spec!r} is a greedy-only hindsight bound; use temperature 0"
            )
        self._warn_sampling_mismatch(sampling)
        eos = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id or ())
        reference = self._reference(prompt, max_new_tokens, eos) if self.policy.needs_reference else None
        # This decode's policy state (a bandit with carry=1 continues the last decode's statistics).
        policy = self.policy_run = self.policy.start_decode(self.policy_run, reference)
        reads0 = host_reads.count
        t_dev = self._device
        clock = PhaseClock(t_dev) if profile else None

        start = time.perf_counter()
        drafter = self._round_drafter
        if drafter is not None:
            drafter.begin(prompt, sampling, seed)
        res = GenerationResult(new_ids=torch.empty(0, dtype=torch.long))
        # The sequence lives on the target's device (a draft elsewhere reads its context by copy); `out`
        # mirrors the generated tokens on the host, filled from each round's status read.
        seq = torch.empty(prompt.numel() + max_new_tokens + 1, dtype=torch.long, device=t_dev)
        seq[: prompt.numel()] = upload(prompt, t_dev)  # pinned on CUDA: a pageable copy would sync
        out: list[int] = []
        # A drafter with rounds of its own reads the committed tokens as host ints (the prompt is on the CPU).
        prompt_ids: list[int] = read(prompt) if drafter is not None and drafter.longest_round else []
        n = prompt.numel()  # committed length
        runner = self._runner  # the target's KV cache: holds runner.length tokens
        runner.reset(n + max_new_tokens + self._verifier.slack)  # room for a padded round
        if streamer is not None:
            streamer.put(prompt[None])
        done = False
        reads_states = drafter is not None and self.reads_states
        while not done and n - prompt.numel() < max_new_tokens:
            generated = n - prompt.numel()
            room = max_new_tokens - generated - 1  # candidates that fit: the round's bonus token comes after
            cap = min(policy.start_round(generated), room)
            if drafter is not None and not drafter.ready:
                cap = 0  # a feature drafter before the target's first states: this round verifies alone
            if clock is not None:
                clock.mark()
                calls0 = self._draft_calls()
            # A drafter's own round (a copy of the context) runs without the policy, up to the tokens left.
            own = drafter.own_round(prompt_ids, out, room) if drafter is not None else None
            if own is not None:
                seq[n : n + len(own)] = upload(torch.tensor([s.token for s in own]), t_dev)
            steps = own if own is not None else draft_round(drafter, policy, seq, n, cap) if cap > 0 else []
            num = len(steps)
            if clock is not None:
                clock.mark()
                res.phases.setdefault("draft_forwards", []).append(self._draft_calls() - calls0)
                res.phases.setdefault("verify_tokens", []).append(n + num - runner.length)
            # One unit: the target's forward over [x_n, X_1..X_L] (or the prompt), S, the verifier, the
            # packed status [τ, next token, X_1..X_L].
            fed_from = runner.length
            if reads_states:  # and the target's states of the fed positions, for a feature drafter
                status, states = self._verifier.verify(seq, n, steps, sampling, seed, states=True)
                status = read(status)
            else:
                status = read(self._verifier.verify(seq, n, steps, sampling, seed))  # the round's one read
            tau, nxt = status[0], status[1]
            new = [*status[2 : 2 + tau], nxt]
            for i, tok in enumerate(new):
                if tok in eos:
                    new, done = new[: i + 1], True
                    break
            if stop_check is not None and (keep := stop_check(new)) is not None:
                new, done = new[:keep], True
            out += new
            # Both caches keep exactly the committed tokens they have seen: prefix + accepted candidates.
            runner.rollback(n + tau)
            if drafter is not None:
                drafter.rollback(n + tau)
                if reads_states:  # the accepted positions' states: fed_from..n+τ-1
                    drafter.observe(states[: n + tau - fed_from], fed_from)
            if clock is not None:
                clock.mark()
            n += len(new)
            if own is None:  # the policy learns (AdaEDL's λ) from its own rounds only
                policy.end_round(num, tau)
            else:
                res.copied_rounds += 1
            res.rounds += 1
            res.drafted += num
            res.discarded += num - tau
            res.accepted_per_round.append(tau)
            res.drafted_per_round.append(num)
            if streamer is not None:
                streamer.put(torch.tensor(new))
        if streamer is not None:
            streamer.end()
        res.new_ids = torch.tensor(out, dtype=torch.long)
        res.target_calls = res.rounds
        res.draft_calls = self._draft_calls()
        res.head_calls = policy.head_calls
        res.host_reads = host_reads.count - reads0
        if clock is not None:  # marks come in threes per round: start, end of drafting, end of verification
            ms = clock.elapsed_ms()
            res.phases["draft_ms"] = ms[0::3]
            res.phases["verify_ms"] = ms[1::3]
        res.wall_time = time.perf_counter() - start
        return res

    # --------------------------------------------------------------------------------------------- helpers

    def _reference(self, prompt: torch.Tensor, max_new_tokens: int, eos: set[int]) -> list[list[bool]]:
        """The oracle's hindsight (`acchead.inference.oracle_reference`)."""
        if self.draft_model is None:
            raise AccheadError(f"policy {self.policy.spec!r} needs a draft model")
        states = self._verifier.state_layers if self.reads_states else None
        return oracle_reference(self.target, self.draft_model, prompt, max_new_tokens, eos, states)

    def _draft_calls(self) -> int:
        """Draft forwards since the drafter's `begin` (0 without one, or under a policy that never drafts)."""
        return self._round_drafter.draft_calls if self._round_drafter is not None else 0

    def _warn_sampling_mismatch(self, sampling: SamplingConfig) -> None:
        if self.head_meta is None or not (self.policy.needs_hidden or self.policy.needs_state):
            return
        if (trained := self.head_meta.sampling_config) != sampling:
            warnings.warn(f"the head's labels were computed under {trained}, decoding uses {sampling}: its "
                          "acceptance predictions will be off (DESIGN §2)", stacklevel=3)  # fmt: skip
