"""The SpecDec++ acceptance head: a small residual MLP on the draft's final hidden state."""

from __future__ import annotations

import torch
from torch import nn

from acchead.lookahead import check_kind, input_size

# The stop threshold h that `specdecpp` uses when its spec names none and the head records none (heads
# written before heads recorded one). Measured on the demo pair (README "Results"): h = 0.8 reached
# 99.7-100% of the best threshold's speed-up for the shipped lookahead heads under greedy decoding and
# under T = 1 / top-k 50, and was the best h of the paper's candidate head under greedy, at c = 0.2.
DEFAULT_H = 0.8


class ResidualBlock(nn.Module):
    """`x + SiLU(Linear(x))`, hidden size preserved."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class AcceptanceHead(nn.Module):
    """Predicts the logit of the probability that the target accepts a draft candidate.

    The paper's "(D+1)-layer ResNet": `depth` residual blocks with independent weights, then
    `Linear(width, 1)`. `depth = 0` is a linear probe. A head whose inputs are more than the state
    (`acchead.lookahead`), or whose `width` is not the draft's hidden size, first projects its input
    vector to `width` with one Linear.

    Args:
        hidden_size: width of the draft model's final hidden state.
        depth: number of residual blocks D (>= 0).
        kind: "candidate" (the paper's: reads e_k after Y_k was fed) or "lookahead" (reads the state that
            produced q_k, plus `inputs`, before Y_k is fed); see DESIGN §3.1.
        inputs: what a lookahead head reads, a subset of `acchead.lookahead.LOOKAHEAD_INPUTS` ("state",
            "logq", "entropy", "token", "topk", "depth").
        default_h: the stop threshold `specdecpp` uses with this head when its spec names no `h`; in
            (0, 1). `acchead.load_head` sets it from the head file's metadata.
        width: width of the residual blocks; None = `hidden_size` (the paper's). The head runs once per
            drafted candidate on one vector, so its cost is reading its weights: at 576 wide its four
            matrices (5.3 MB in float32) outgrow a 2 MB L2 cache and stream from L3 on every call.
    """

    def __init__(
        self,
        hidden_size: int,
        depth: int,
        kind: str = "candidate",
        inputs: tuple[str, ...] | list[str] = ("state",),
        default_h: float = DEFAULT_H,
        width: int | None = None,
    ) -> None:
        super().__init__()
        if hidden_size < 1:
            raise ValueError(f"hidden_size must be >= 1, got {hidden_size}")
        width = hidden_size if width is None else width
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        if not 0.0 < default_h < 1.0:
            raise ValueError(f"default_h must be in (0, 1), got {default_h}")
        self.default_h = float(default_h)  # a plain attribute: not a weight, not in the state dict
        self.hidden_size = hidden_size
        self.width = width
        self.depth = depth
        self.kind = kind
        self.inputs = check_kind(kind, inputs)
        self.input_size = input_size(self.inputs, hidden_size)
        # A state-only head of the state's width has no projection: exactly the paper's architecture.
        plain = self.inputs == ("state",) and width == hidden_size
        self.proj = None if plain else nn.Linear(self.input_size, width)
        # A list comprehension, not `[ResidualBlock(h)] * depth`: the latter repeats ONE module, so all
        # blocks would share weights (the bug in the paper's and Medusa's code).
        self.blocks = nn.ModuleList([ResidualBlock(width) for _ in range(depth)])
        self.out = nn.Linear(width, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (..., input_size) -> logits: (...)."""
        x = hidden.to(self.out.weight.dtype)
        if self.proj is not None:
            x = self.proj(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x).squeeze(-1)
