"""BanditSpec arm selection (papers/banditspec.txt; DESIGN §7): pick each round's configuration online.

An arm is a decoding configuration (a policy spec such as `specdec:k=4`, a threshold, a drafter). Before
each round the selector names an arm; after the target has verified, the round's reward is fed back:

    y = accepted + 1 ∈ [1, L + 1]        (the bonus/correction token counts, as in the paper)

with L the longest speculation any arm can make. Because the choice depends only on past rounds (and on
the selector's own random generator, never on the token sampler), every round is an exact speculative
round and the output is distributed as the target's (BanditSpec Proposition 3.1).

UCBSpec is the paper's rule with the square roots the stored copy lost (DESIGN §7): after one pull of each
arm, pick argmax_i μ̂_i + (L/2)·sqrt((1+n_i)/n_i² · (1 + 2·ln(K·t²·sqrt(1+n_i)/δ))), t the index of the
round being chosen (1-based), K the number of arms. The public code's bonus (divided by the total pull
count) is deliberately not reproduced: it stops exploring after warm-up.

EXP3Spec: η_t = sqrt(ln K / (t·K)); p_t ∝ exp(−η_t·S) with S the summed importance-weighted losses;
draw I_t ~ p_t; add (L + 1 − y) / (L · p_{t,I_t}) to S_{I_t}.

A tokens-per-second reward is an option (the public code's choice). Its range is not known up front, so
losses and the UCB width use the largest rate seen so far as the upper end of the range, with 0 as the
lower end — a heuristic, said so here; the theory covers the accepted-token reward only.

This module holds the selectors only; `acchead.inference.bandit_policy` plugs them into the decoder.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from typing import Literal

import numpy as np

from acchead.errors import AccheadError

RewardKind = Literal["tokens", "rate"]


class ArmSelector(ABC):
    """Online choice among `num_arms` configurations; rewards arrive after each round.

    Args:
        num_arms: K ≥ 1.
        max_len: L ≥ 1, the longest speculation any arm can make (rewards lie in [1, L + 1]).
        reward: "tokens" (y = accepted + 1, the paper's reward) or "rate" (tokens per second).
    """

    name = "selector"

    def __init__(self, num_arms: int, max_len: int, reward: RewardKind = "tokens") -> None:
        if num_arms < 1:
            raise AccheadError(f"a bandit needs at least one arm, got {num_arms}")
        if max_len < 1:
            raise AccheadError(f"the longest speculation L must be >= 1, got {max_len}")
        if reward not in ("tokens", "rate"):
            raise AccheadError(f"bandit reward must be 'tokens' or 'rate', got {reward!r}")
        self.num_arms = num_arms
        self.max_len = max_len
        self.reward = reward
        self.reset()

    def reset(self) -> None:
        """Forget all history (called at the start of each prompt unless the statistics are carried)."""
        self.t = 0  # rounds completed
        self.pulls = np.zeros(self.num_arms, dtype=np.int64)
        self.reward_sum = np.zeros(self.num_arms, dtype=np.float64)
        self.rate_max = 0.0

    def _range(self) -> tuple[float, float]:
        """(lo, hi) of the reward range used for normalisation."""
        if self.reward == "tokens":
            return 1.0, float(self.max_len + 1)
        return 0.0, max(self.rate_max, 1e-12)

    @abstractmethod
    def select(self) -> int:
        """Arm index for the next round; depends only on rewards already fed back."""

    def update(self, arm: int, reward: float) -> None:
        """Feed back the reward of the round played with `arm`."""
        if not 0 <= arm < self.num_arms:
            raise IndexError(f"arm {arm} out of range for {self.num_arms} arms")
        if self.reward == "tokens" and not 1 <= reward <= self.max_len + 1:
            raise ValueError(f"token reward must lie in [1, {self.max_len + 1}], got {reward}")
        self.t += 1
        self.pulls[arm] += 1
        self.reward_sum[arm] += reward
        self.rate_max = max(self.rate_max, reward) if self.reward == "rate" else self.rate_max

    def means(self) -> np.ndarray:
        """Empirical mean reward per arm, (K,) float64 (nan for arms never pulled)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.reward_sum / self.pulls


class UCBSpec(ArmSelector):
    """UCBSpec (BanditSpec Algorithm 4) with the paper's confidence radius.

    Args:
        delta: confidence parameter δ (1/2 in the paper's analysis).
    """

    name = "ucb"

    def __init__(
        self, num_arms: int, max_len: int, delta: float = 0.5, reward: RewardKind = "tokens"
    ) -> None:
        if not 0 < delta < 1:
            raise AccheadError(f"ucb delta must lie in (0, 1), got {delta}")
        self.delta = delta
        super().__init__(num_arms, max_len, reward)

    def radius(self, t: int | None = None) -> np.ndarray:
        """Confidence radius per arm at round t (default: the next round), (K,); inf for unpulled arms."""
        t = self.t + 1 if t is None else t
        n = self.pulls.astype(np.float64)
        lo, hi = self._range()
        width = (hi - lo) / 2  # = L/2 for the accepted-token reward
        out = np.full(self.num_arms, math.inf)
        seen = n > 0
        ns = n[seen]
        log_term = np.log(self.num_arms * t**2 * np.sqrt(1 + ns) / self.delta)
        out[seen] = width * np.sqrt((1 + ns) / ns**2 * (1 + 2 * log_term))
        return out

    def select(self) -> int:
        unpulled = np.flatnonzero(self.pulls == 0)
        if unpulled.size:  # warm-up: each arm once, in order
            return int(unpulled[0])
        return int(np.argmax(self.means() + self.radius()))


class EXP3Spec(ArmSelector):
    """EXP3Spec (BanditSpec Algorithm 5): anytime EXP3 with η_t = sqrt(ln K / (t·K)).

    Args:
        seed: seed of the selector's own generator (kept apart from the token sampler's).
    """

    name = "exp3"

    def __init__(
        self, num_arms: int, max_len: int, seed: int = 0, reward: RewardKind = "tokens"
    ) -> None:
        self.seed = seed
        super().__init__(num_arms, max_len, reward)

    def reset(self) -> None:
        super().reset()
        self.rng = random.Random(self.seed)
        self.loss_sum = np.zeros(self.num_arms, dtype=np.float64)  # S_i
        self._last_probs: np.ndarray | None = None

    def learning_rate(self, t: int | None = None) -> float:
        """η_t for round t (default: the next round)."""
        t = self.t + 1 if t is None else t
        return math.sqrt(math.log(self.num_arms) / (t * self.num_arms))

    def probabilities(self) -> np.ndarray:
        """p_t ∝ exp(−η_t·S), (K,) float64, recomputed from S each round (max subtracted first)."""
        z = -self.learning_rate() * self.loss_sum
        w = np.exp(z - z.max())
        return w / w.sum()

    def select(self) -> int:
        p = self.probabilities()
        self._last_probs = p
        u = self.rng.random()
        # Inverse-CDF draw; the min guards against a cumulative sum that rounds to just below 1.
        return int(min(np.searchsorted(np.cumsum(p), u, side="right"), self.num_arms - 1))

    def update(self, arm: int, reward: float) -> None:
        # The importance weight uses the probability the arm was drawn with, i.e. before this update.
        p = self._last_probs if self._last_probs is not None else self.probabilities()
        super().update(arm, reward)
        lo, hi = self._range()
        loss = min(max((hi - reward) / (hi - lo), 0.0), 1.0)  # = (L + 1 − y) / L for token rewards
        self.loss_sum[arm] += loss / p[arm]
        self._last_probs = None


def make_selector(
    kind: str,
    num_arms: int,
    max_len: int,
    *,
    delta: float = 0.5,
    seed: int = 0,
    reward: RewardKind = "tokens",
) -> ArmSelector:
    """Selector by name: "ucb" or "exp3"."""
    if kind == "ucb":
        return UCBSpec(num_arms, max_len, delta=delta, reward=reward)
    if kind == "exp3":
        return EXP3Spec(num_arms, max_len, seed=seed, reward=reward)
    raise AccheadError(f"unknown bandit {kind!r} (expected 'ucb' or 'exp3')")
