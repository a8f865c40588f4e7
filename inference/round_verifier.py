"""The target's side of a speculative round: one forward verifies the candidates, in one unit.

`RoundVerifier` owns what `SpeculativeDecoder` needs of the target per round: its KV cache (a
`ModelRunner`, eager or fast), the verifier (token or block, `acchead.inference.verification`) and the
keys of the verifier's draws. `verify` runs ONE unit (`acchead.inference.units.verify_post`): the
target's forward over [x_n, X_1..X_L] (plus any committed tokens the cache has not seen, e.g. the
prompt), S's processing of its L + 1 rows, the verifier, and the packed status [τ, next token,
X_1..X_L], the one value the host reads per round. `warm_up` compiles, on the fast path, that unit for
every candidate count a decode can verify.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from acchead.errors import AccheadError
from acchead.inference.device_random import NEXT, TAU, Word, key_hash, key_input
from acchead.inference.drafters import DraftStep
from acchead.inference.model_runner import ModelRunner
from acchead.inference.units import verify_post
from acchead.sampling import SamplingConfig


def _verify_with_states(logits, hidden, model, cache, *args) -> tuple[torch.Tensor, torch.Tensor]:
    """`verify_post`, also passing on the (fed, H) states the forward computed (eager only)."""
    (status,) = verify_post(logits, hidden, model, cache, *args)
    return status, hidden


class RoundVerifier:
    """Verification of a round's candidates by the target (batch size 1).

    Args:
        runner: the target's runner (its KV cache holds `runner.length` committed tokens).
        verify: `verify_token` or `verify_block` (`acchead.inference.verification.VERIFIERS`).
        vocab: V, the width of the target's distributions (its output embedding's rows).
        device: the target's device, where the sequence, q and the status live.
        key_tensors: pass the draws' keys as tensors (a compiled unit: an int would be a constant of its
            graph, one recompile per round); else Python ints.
    """

    def __init__(
        self, runner: ModelRunner, verify: Callable, vocab: int, device: torch.device, key_tensors: bool
    ) -> None:
        self.runner = runner
        self.verify_fn = verify
        self.vocab = vocab
        self.device = device
        self.key_tensors = key_tensors

    def verify(
        self, seq: torch.Tensor, n: int, steps: list[DraftStep], sampling: SamplingConfig, seed: int,
        states: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Verify the L candidates in seq[n : n + L] (drafted as `steps`) after the n committed tokens.

        Feeds seq[runner.length : n + L] to the target, then writes the next token into seq[n + τ].
        Returns the packed status, (2 + L,) int64 on the device: [τ, next token, X_1..X_L]. The caller
        reads it and rolls the cache back (`rollback`) to the tokens it keeps. `states` (eager path): also
        return the target's final hidden states of every fed position, (fed, H), for a feature drafter.
        """
        num = len(steps)
        keys = [self.key(seed, purpose, n) for purpose in (TAU, NEXT)]
        post_args = (seq[n : n + num], self.stack_q(steps), sampling, self.verify_fn, *keys)
        out = self.runner.feed(
            seq[self.runner.length : n + num], keep=num + 1, all_hidden=states,
            post=_verify_with_states if states else verify_post, post_args=post_args,
        )  # fmt: skip
        status = out[0]
        seq.index_copy_(0, status[:1] + n, status[1:2])  # the next token, after the τ accepted
        return (status, out[1]) if states else status

    def key(self, seed: int, purpose: int, n: int) -> Word:
        """The key of a verifier draw in the round starting at n."""
        return key_input(key_hash(seed, purpose, n, 0), self.device, self.key_tensors)

    def stack_q(self, steps: list[DraftStep]) -> torch.Tensor:
        """(L, V) draft distributions on the target's device, zero-padded to its vocabulary width."""
        v = self.vocab
        if not steps:
            return torch.zeros(0, v, device=self.device)
        q = torch.stack([s.q for s in steps]).to(device=self.device, dtype=torch.float32)
        if q.shape[-1] > v:
            raise AccheadError(f"the drafter's vocabulary ({q.shape[-1]}) is wider than the target's ({v})")
        return torch.nn.functional.pad(q, (0, v - q.shape[-1])) if q.shape[-1] < v else q

    def warm_up(self, max_length: int, max_cap: int, sampling: SamplingConfig) -> None:
        """Run (fast path: compile) the verification of 0..`max_cap` candidates under S, for sequences
        of up to `max_length` tokens; leaves the cache empty."""
        runner = self.runner
        runner.reset(max_length)
        dummy = torch.zeros(max(max_cap + 1, 2), dtype=torch.long, device=self.device)
        runner.feed(dummy[:2])  # a prefill (eager: no unit compiled for it), then back to length 1
        runner.rollback(1)
        keys = [self.key(0, purpose, 0) for purpose in (TAU, NEXT)]
        for num in range(max_cap + 1):
            runner.rollback(1)
            q = torch.zeros(num, self.vocab, device=self.device)
            q[:, 0] = 1.0  # a valid draft distribution for the dummy candidates (token 0)
            runner.feed(
                dummy[: num + 1], keep=num + 1, post=verify_post,
                post_args=(dummy[1 : num + 1], q, sampling, self.verify_fn, *keys),
            )  # fmt: skip
        runner.reset(max_length)
