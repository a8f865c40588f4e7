"""The target's side of a speculative round: one forward verifies the candidates, in one unit.

`RoundVerifier` owns what `SpeculativeDecoder` needs of the target per round: its KV cache (a
`ModelRunner`, eager or fast), the verifier (token or block, `acchead.inference.verification`) and the
keys of the verifier's draws. `verify` runs ONE unit (`acchead.inference.units.verify_post`): the
target's forward over [x_n, X_1..X_L] (plus any committed tokens the cache has not seen, e.g. the
prompt), S's processing of its L + 1 rows, the verifier, and the packed status [τ, next token,
X_1..X_L], the one value the host reads per round.

On the fast path a graph with the token count as a constant would mean cap + 1 graphs (21 for SpecDec++'s
default cap, 35-50 s of Inductor each for the demo target on the CPU: issue 32). Instead the count of real
candidates enters the unit as a tensor (`acchead.inference.verification`, `num`) and the round is padded up
to the next of a few widths (`VERIFY_WIDTHS`: 1, 2, 3, 4, 6, 8, 12, 16, 24, ...), so one graph per width
serves every L and every policy, fixed K or adaptive, of a given S and verifier. The padded positions' keys
and values land past the committed prefix in the static cache, where the causal mask hides them until the
next round overwrites them (the decoder rolls back after every round).

On the device path (CUDA graphs: one capture per shape anyway) the widths from `SYMBOLIC_FROM` on share
one compiled graph whose token count is a symbol (`torch._dynamo.mark_dynamic`, guarded to that range so
that it never serves the static widths), compiled once and captured per width. Not on the CPU: there
Inductor's kernels for a symbolic row count ran the verification about twice as slow (fixed K = 4, whose
5-token rounds took it, decoded 295 against K = 3's 447 tokens/s; docs/speed.md).

`warm_up` compiles (and captures) what a decode can use.
"""

from __future__ import annotations

import itertools
import math
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from acchead.errors import AccheadError
from acchead.inference.device_random import NEXT, TAU, Word, key_hash, key_input
from acchead.inference.drafters import DraftStep
from acchead.inference.model_runner import ModelRunner
from acchead.inference.static_runner import MAX_SYMBOLIC_COUNT
from acchead.inference.units import verify_post
from acchead.sampling import SamplingConfig

# The widths (tokens fed: the last committed token + candidates) a padded verification is compiled for:
# dense where rounds are common and a padded row costs most (the CPU's few-row forwards), ~1.5x apart
# beyond. A round of f tokens runs the graph of the smallest width >= f.
VERIFY_WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


# On the device path, the width from which one symbolic graph verifies (below it: a static graph each).
SYMBOLIC_FROM = 5

# The most padding any round gets: the cache room a padded round may write past the tokens it verifies.
PAD_SLACK = max(b - a for a, b in itertools.pairwise(VERIFY_WIDTHS)) - 1


# Up to this width a CPU's matrix kernels are least predictable (few rows), and a speculative round's widths
# are timed up to it at least: a round of 2 or 3 tokens may verify faster at it.
FEW_ROWS = 4

# Per target runner and verification unit (S, verifier, states), the measured ms of each width's unit
# (`RoundVerifier.warm_up`), freed with the runner.
_UNIT_MS: weakref.WeakKeyDictionary[Any, dict[tuple, dict[int, float]]] = weakref.WeakKeyDictionary()


def verify_width(fed: int) -> int:
    """The padded width of a verification that feeds `fed` tokens (past the ladder: `fed` itself)."""
    return next((w for w in VERIFY_WIDTHS if w >= fed), fed)


def cheapest_widths(unit_ms: dict[int, float], margin: float = 0.05) -> dict[int, int]:
    """For each count fed up to the widest timed width, the width to verify it at: the ladder's own
    (`verify_width`), unless a wider one within `PAD_SLACK` was timed over `margin` faster (`unit_ms`: the
    measured ms of one unit per width). A CPU's matrix kernels can run a few rows slower than more: on the
    2-core AMD box SmolLM2's units took 56 / 71 / 84 / 70 ms at widths 1 / 2 / 3 / 4 (docs/speed.md)."""
    out = {}
    for fed in range(1, max(unit_ms, default=0) + 1):
        own = verify_width(fed)
        if own not in unit_ms:
            continue
        best = min((w for w in unit_ms if fed <= w <= fed + PAD_SLACK), key=lambda w: (unit_ms[w], w))
        out[fed] = best if unit_ms[best] < (1 - margin) * unit_ms[own] else own
    return out


def _verify_with_states(logits, hidden, model, cache, *args) -> tuple[torch.Tensor, torch.Tensor]:
    """`verify_post`, also passing on the (fed, H) states the forward computed."""
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
        padded: pad each round to its `verify_width` (the fast path, compiled or not); else feed exactly
            the round's tokens.
        symbolic: the widths from `SYMBOLIC_FROM` on share one graph symbolic in the token count (the
            device path: compiled once, captured per width).
        state_layers: with `verify(..., states=True)`, the states also hold these decoder layers' outputs
            after the final state (a feature draft with `fused_layers`).
    """

    def __init__(
        self, runner: ModelRunner, verify: Callable, vocab: int, device: torch.device, key_tensors: bool,
        padded: bool = False,
        symbolic: bool = False,
        state_layers: tuple[int, ...] = (),
    ) -> None:  # fmt: skip
        self.runner = runner
        self.state_layers = tuple(state_layers)
        self.verify_fn = verify
        self.vocab = vocab
        self.device = device
        self.key_tensors = key_tensors
        if symbolic and not padded:
            raise ValueError("a symbolic verification graph serves padded rounds: pass padded=True too")
        self.padded = padded
        self.symbolic = symbolic
        # count fed -> the width it is verified at: the ladder's, or a cheaper one timed at `warm_up`
        self.widths: dict[int, int] = {}
        self._unit_ms: dict[int, float] = {}  # width -> the ms of its unit, timed at `warm_up`

    @property
    def slack(self) -> int:
        """Cache room a padded round may write past the tokens it verifies (the same for every cap, so
        every decoder of the model sizes its shared static cache alike, and shares its graphs)."""
        return PAD_SLACK if self.padded else 0

    def verify(
        self, seq: torch.Tensor, n: int, steps: list[DraftStep], sampling: SamplingConfig, seed: int,
        states: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Verify the L candidates in seq[n : n + L] (drafted as `steps`) after the n committed tokens.

        Feeds seq[runner.length : n + L] to the target, then writes the next token into seq[n + τ].
        Returns the packed status, (2 + L,) int64 on the device: [τ, next token, X_1..X_L]. The caller
        reads it and rolls the cache back (`rollback`) to the tokens it keeps. `states`: also return the
        target's states of every fed position, (fed, W), for a feature drafter (`state_layers`).
        """
        num = len(steps)
        keys = [self.key(seed, purpose, n) for purpose in (TAU, NEXT)]
        fed = n + num - self.runner.length
        if self.padded and self.runner.length > 0 and fed == num + 1:
            # [x_n, X_1..X_L (, 0...)] (up to the width); the prompt's forward (length 0) runs eager
            out = self.runner.feed(**self._unit_inputs(seq[n - 1 : n + num], steps, sampling, keys, states))
        else:
            post_args = (seq[n : n + num], self.stack_q(steps), sampling, self.verify_fn, *keys)
            out = self.runner.feed(
                seq[self.runner.length : n + num], keep=num + 1, all_hidden=states,
                post=_verify_with_states if states else verify_post, post_args=post_args,
                state_layers=self.state_layers if states else (),
            )  # fmt: skip
        status = out[0]
        seq.index_copy_(0, status[:1] + n, status[1:2])  # the next token, after the τ accepted
        return (status, out[1]) if states else status

    def _unit_inputs(
        self, ids: torch.Tensor, steps: list[DraftStep], sampling: SamplingConfig, keys: list[Word],
        states: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        """`runner.feed`'s arguments for the verification of [x_n, X_1..X_L] (`ids`, (L + 1,)) as a
        padded unit (symbolic from `SYMBOLIC_FROM` when `symbolic`): the real candidate count enters as a 0-d
        tensor, so L is no constant of the graph. `states`: the unit also returns the target's states of
        the width's positions ((width, H); a feature drafter reads the first τ + 1)."""
        num = len(steps)
        width = self.widths.get(num + 1) or verify_width(num + 1)
        ids = torch.nn.functional.pad(ids, (0, width - num - 1))
        tokens, q = ids[1:], self.stack_q(steps, width - 1)
        symbolic = SYMBOLIC_FROM if self.symbolic and width >= SYMBOLIC_FROM else 0
        if symbolic:
            for t in (tokens, q):
                torch._dynamo.mark_dynamic(t, 0, min=symbolic - 1, max=MAX_SYMBOLIC_COUNT - 1)
        real = torch.full((), num, dtype=torch.long, device=self.device)
        post_args = (tokens, q, sampling, self.verify_fn, *keys, real)
        post = _verify_with_states if states else verify_post
        return {"tokens": ids, "keep": 0, "post": post, "post_args": post_args, "symbolic": symbolic,
                "all_hidden": states, "state_layers": self.state_layers if states else ()}  # fmt: skip

    def key(self, seed: int, purpose: int, n: int) -> Word:
        """The key of a verifier draw in the round starting at n."""
        return key_input(key_hash(seed, purpose, n, 0), self.device, self.key_tensors)

    def stack_q(self, steps: list[DraftStep], rows: int | None = None) -> torch.Tensor:
        """(L, V) draft distributions on the target's device, zero-padded to its vocabulary width (and
        with zero rows to `rows` rows: a padded round's empty slots)."""
        v = self.vocab
        extra = 0 if rows is None else rows - len(steps)
        if not steps:
            return torch.zeros(extra, v, device=self.device)
        q = torch.stack([s.q for s in steps]).to(device=self.device, dtype=torch.float32)
        if q.shape[-1] > v:
            raise AccheadError(f"the drafter's vocabulary ({q.shape[-1]}) is wider than the target's ({v})")
        if q.shape[-1] < v or extra:
            q = torch.nn.functional.pad(q, (0, v - q.shape[-1], 0, extra))
        return q

    def warm_up(
        self, max_length: int, max_cap: int, sampling: SamplingConfig, states: bool = False,
        timed: int | None = None,
    ) -> None:  # fmt: skip
        """Compile the fast path's (padded) verification of 0..`max_cap` candidates under S, i.e. of the
        widths they round up to, for sequences of up to `max_length` tokens (`states`: the units that also
        return the target's states, for a feature drafter); leaves the cache empty. `timed` > 0 (None: 3
        when the units are compiled): also compile `FEW_ROWS` for a cap below it, replay each width's unit
        that many times more and verify each count at the cheapest width (`cheapest_widths`; the fastest
        replay counts). The timings are kept per runner and unit, so decoders of a target agree on a
        width."""
        if not self.padded:
            raise ValueError("warm_up compiles the fast path's padded verification units: padded=True")
        runner = self.runner
        capacity = max_length + self.slack
        runner.reset(capacity)
        widths = sorted({verify_width(fed) for fed in range(1, max_cap + 2)})
        if timed is None:
            timed = 3 if self.key_tensors else 0
        if timed and max_cap > 0 and widths[-1] < FEW_ROWS:  # the few-row widths are all timed
            widths.append(FEW_ROWS)
        dummy = torch.zeros(max(widths[-1], 2), dtype=torch.long, device=self.device)
        runner.feed(dummy[:2])  # a prefill (eager: no unit compiled for it), then back to length 1
        keys = [self.key(0, purpose, 0) for purpose in (TAU, NEXT)]
        q = torch.zeros(self.vocab, device=self.device)
        q[0] = 1.0  # a valid draft distribution for the dummy candidates (token 0)
        unit_ms = _UNIT_MS.setdefault(runner, {}).setdefault((sampling, self.verify_fn, states), {})
        self.widths = {}  # each ladder width compiles its own unit
        for width in widths:
            steps = [DraftStep(token=0, q=q, hidden=None, index=i + 1) for i in range(width - 1)]
            for rep in range(1 + (timed if width not in unit_ms else 0)):
                runner.rollback(1)
                start = time.perf_counter()
                out = runner.feed(**self._unit_inputs(dummy[:width], steps, sampling, keys, states))
                out[0].cpu()  # the status: waits for the unit (a GPU's replay)
                if rep:
                    unit_ms[width] = min(unit_ms.get(width, math.inf), 1e3 * (time.perf_counter() - start))
        self.widths = cheapest_widths({w: unit_ms[w] for w in widths if w in unit_ms}) if timed else {}
        self._unit_ms = dict(unit_ms) if timed else {}
        runner.reset(capacity)

    def fed_ms(self) -> dict[int, float]:
        """For each count of tokens fed that the last timed `warm_up` covered, the ms of the unit that
        verifies it (its cheapest width's): what a priced SpecDec++ reads. {} before a timed warm-up."""
        return {fed: self._unit_ms[w] for fed, w in self.widths.items() if w in self._unit_ms}
