"""A reference solution for lesson 08's build exercise: Megatron's f and g as autograd functions, and
the column- and row-parallel linear layers built on them."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


class CopyToShards(torch.autograd.Function):
    """f: forward nothing (every rank has x); backward all-reduce ∂loss/∂x, to which each shard adds a part."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad


class ReduceFromShards(torch.autograd.Function):
    """g: forward all-reduce the partial sums; backward nothing (a sum's gradient reaches every term)."""

    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


class ColumnParallelLinear(torch.nn.Module):
    """This rank's share of `dense`'s output features: rows of its weight and bias (dim 0 of out × in)."""

    def __init__(self, dense: torch.nn.Linear):
        super().__init__()
        rank, world = dist.get_rank(), dist.get_world_size()
        self.weight = torch.nn.Parameter(dense.weight.detach().chunk(world, dim=0)[rank].clone())
        self.bias = torch.nn.Parameter(dense.bias.detach().chunk(world, dim=0)[rank].clone())

    def forward(self, x):
        # this rank's slice of the outputs
        return F.linear(CopyToShards.apply(x), self.weight, self.bias)


class RowParallelLinear(torch.nn.Module):
    """This rank's share of `dense`'s input features: columns of its weight (dim 1); the bias whole, added once."""

    def __init__(self, dense: torch.nn.Linear):
        super().__init__()
        rank, world = dist.get_rank(), dist.get_world_size()
        self.weight = torch.nn.Parameter(dense.weight.detach().chunk(world, dim=1)[rank].clone())
        self.bias = torch.nn.Parameter(dense.bias.detach().clone())

    def forward(self, x_slice):
        # the partial sums added over the ranks, then the bias, once
        return ReduceFromShards.apply(F.linear(x_slice, self.weight)) + self.bias
