"""Lesson 14's lean ring on one rank, in this process: with nothing to pass round it is plain causal attention,
forward and backward (its launched tests are in tests/process/test_ring_launch.py)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fourcard_helpers.ring import LeanRingAttention


@pytest.fixture
def one_rank():
    """A real gloo group of one rank, in this process."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("balanced", [False, True])
def test_the_lean_ring_on_one_rank_is_causal_attention(one_rank, balanced: bool) -> None:
    torch.manual_seed(0)
    q, k, v, grad_out = (torch.randn(1, 4, 64, 16, dtype=torch.float64) for _ in range(4))
    ring_inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    out = LeanRingAttention.apply(*ring_inputs, 64, balanced)
    (out * grad_out).sum().backward()
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(*inputs, is_causal=True)
    (expected * grad_out).sum().backward()
    assert (out - expected).abs().max() <= 1e-13
    for mine, theirs in zip(ring_inputs, inputs):
        assert (mine.grad - theirs.grad).abs().max() <= 1e-13
