"""Lesson 14's mixture of experts: its capacity serves every first choice before any second choice (expert parallel in
real launches: tests/process/test_moe_launch.py)."""
from __future__ import annotations

import math

import torch

from fourcard_helpers.moe import MoE


def two_tokens_crossed() -> tuple[MoE, torch.Tensor]:
    """Two experts, top-2, two tokens: token 0 prefers expert 0, token 1 expert 1; each's second choice is the other's
    first. Capacity factor 0.5: ceil(0.5 · 4 / 2) = 1 assignment per expert."""
    torch.manual_seed(0)
    layer = MoE(4, 2, top_k=2, capacity_factor=0.5).double()
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.bias.zero_()
        layer.router.weight[0, 0] = layer.router.weight[1, 1] = 1.0   # expert e's score is the token's coordinate e
    x = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0]], dtype=torch.float64)
    return layer, x


def test_every_first_choice_is_served_before_any_second_choice() -> None:
    layer, x = two_tokens_crossed()
    out = layer(x)
    _, chosen, weights = layer.route(x)
    assert chosen.tolist() == [[0, 1], [1, 0]]
    # In order of position alone, token 0's second choice (expert 1) would take expert 1's one place before token 1's
    # first choice: token 1 would get nothing. First choices first: each token keeps its first expert, no second.
    assert layer.kept.tolist() == [1, 1]
    with torch.no_grad():
        for t in range(2):
            expected = weights[t, 0] * layer.experts[t](x[t:t + 1])[0]
            assert torch.allclose(out[t], expected, rtol=0, atol=1e-12), t
    assert out[1].abs().max() > 0


def test_capacity_agrees_with_a_plain_loop_for_top_2() -> None:
    """Random routing, top-2, capacity factor 1: which assignments are kept, against a loop over choices, then
    positions; and every output against the kept experts' weighted sum."""
    torch.manual_seed(1)
    layer = MoE(8, 4, top_k=2, capacity_factor=1.0).double()
    x = torch.randn(40, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    out = layer(x)
    _, chosen, weights = layer.route(x)
    capacity = math.ceil(1.0 * chosen.numel() / 4)
    taken, kept = [0] * 4, torch.zeros_like(chosen, dtype=torch.bool)
    for slot in range(2):
        for t in range(len(x)):
            e = chosen[t, slot].item()
            if taken[e] < capacity:
                taken[e] += 1
                kept[t, slot] = True
    assert layer.kept.tolist() == taken
    assert not kept.all() and kept[:, 0].sum() > kept[:, 1].sum()   # the case drops, and drops second choices more
    with torch.no_grad():
        for t in range(len(x)):
            expected = sum(weights[t, s] * layer.experts[chosen[t, s]](x[t:t + 1])[0] for s in range(2) if kept[t, s])
            assert torch.allclose(out[t], torch.as_tensor(expected, dtype=torch.float64).expand_as(out[t]),
                                  rtol=0, atol=1e-12), t
