"""The SpecDec++ acceptance head: a small residual MLP on the draft's final hidden state."""

from __future__ import annotations

import torch
from torch import nn


class ResidualBlock(nn.Module):
    """`x + SiLU(Linear(x))`, hidden size preserved."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class AcceptanceHead(nn.Module):
    """Predicts the logit of the probability that the target accepts the draft token just fed.

    The paper's "(D+1)-layer ResNet": `depth` residual blocks with independent weights, then
    `Linear(hidden_size, 1)`. `depth = 0` is a linear probe.

    Args:
        hidden_size: width of the draft model's final hidden state.
        depth: number of residual blocks D (>= 0).
    """

    def __init__(self, hidden_size: int, depth: int) -> None:
        super().__init__()
        if hidden_size < 1:
            raise ValueError(f"hidden_size must be >= 1, got {hidden_size}")
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        self.hidden_size = hidden_size
        self.depth = depth
        # A list comprehension, not `[ResidualBlock(h)] * depth`: the latter repeats ONE module, so all
        # blocks would share weights (the bug in the paper's and Medusa's code).
        self.blocks = nn.ModuleList([ResidualBlock(hidden_size) for _ in range(depth)])
        self.out = nn.Linear(hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (..., hidden_size) -> logits: (...)."""
        x = hidden.to(self.out.weight.dtype)
        for block in self.blocks:
            x = block(x)
        return self.out(x).squeeze(-1)
