"""AcceptanceHead: shapes for every depth, the residual form, and independent block weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from acchead.head import AcceptanceHead, ResidualBlock


@pytest.mark.parametrize("depth", [0, 1, 2, 3, 4])
def test_shapes_and_parameter_count(depth):
    h = 16
    head = AcceptanceHead(h, depth)
    assert len(head.blocks) == depth
    assert head(torch.randn(3, 5, h)).shape == (3, 5)
    assert head(torch.randn(h)).shape == ()
    assert sum(p.numel() for p in head.parameters()) == depth * (h * h + h) + h + 1


def test_depth_zero_is_a_linear_probe():
    head = AcceptanceHead(8, 0)
    x = torch.randn(4, 8)
    torch.testing.assert_close(head(x), x @ head.out.weight[0] + head.out.bias[0])


def test_forward_matches_hand_written_resnet():
    head = AcceptanceHead(8, 2)
    x = torch.randn(6, 8)
    y = x
    for block in head.blocks:
        y = y + F.silu(y @ block.linear.weight.T + block.linear.bias)
    torch.testing.assert_close(head(x), (y @ head.out.weight.T + head.out.bias).squeeze(-1))


def test_half_precision_features_are_cast_to_the_head_dtype():
    head = AcceptanceHead(8, 1)
    x = torch.randn(2, 8)
    out = head(x.half())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, head(x.half().float()))


def _blocks_independent(blocks: nn.ModuleList) -> bool:
    """True when no two blocks share storage and all have different weight values."""
    weights = [b.linear.weight for b in blocks]
    ptrs = {w.data_ptr() for w in weights} | {b.linear.bias.data_ptr() for b in blocks}
    if len(ptrs) != 2 * len(blocks):
        return False
    return all(not torch.equal(a, b) for i, a in enumerate(weights) for b in weights[i + 1 :])


def test_blocks_have_independent_weights():
    head = AcceptanceHead(16, 4)
    assert _blocks_independent(head.blocks)
    # The paper's / Medusa's `[Block(h)] * D` builds ONE module D times; the check must catch it.
    assert not _blocks_independent(nn.ModuleList([ResidualBlock(16)] * 4))
    # And the blocks train independently: a gradient step on a loss of block 0 leaves the others alone.
    before = [b.linear.weight.detach().clone() for b in head.blocks]
    head.blocks[0].linear.weight.sum().backward()
    with torch.no_grad():
        for p in head.parameters():
            if p.grad is not None:
                p -= p.grad
    after = [b.linear.weight for b in head.blocks]
    assert not torch.equal(before[0], after[0])
    assert all(torch.equal(b, a) for b, a in zip(before[1:], after[1:], strict=True))
    assert len(head.state_dict()) == 2 * 4 + 2


@pytest.mark.parametrize(("hidden", "depth"), [(0, 1), (8, -1)])
def test_invalid_arguments(hidden, depth):
    with pytest.raises(ValueError):
        AcceptanceHead(hidden, depth)
