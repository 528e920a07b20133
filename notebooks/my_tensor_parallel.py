import torch
import torch.distributed as dist
import torch.nn.functional as F


class CopyToShards(torch.autograd.Function):
    """f, before a column-parallel layer."""

    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError


class ReduceFromShards(torch.autograd.Function):
    """g, after a row-parallel layer."""

    @staticmethod
    def forward(ctx, partial):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError


class ColumnParallelLinear(torch.nn.Module):
    """This rank's share of `dense`'s output features: self.weight and self.bias."""

    def __init__(self, dense: torch.nn.Linear):
        super().__init__()
        raise NotImplementedError

    def forward(self, x):
        raise NotImplementedError


class RowParallelLinear(torch.nn.Module):
    """This rank's share of `dense`'s input features: self.weight, and self.bias whole."""

    def __init__(self, dense: torch.nn.Linear):
        super().__init__()
        raise NotImplementedError

    def forward(self, x_slice):
        raise NotImplementedError
