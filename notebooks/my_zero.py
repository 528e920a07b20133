import torch
import torch.distributed as dist
from torch import nn


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1: each rank steps (and keeps the state of) its own share of the parameters, then every rank
    receives every updated parameter from its owner."""

    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, kwargs)
        # your code here: an owner for each parameter, an optimizer_cls for this rank's share
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure=None):
        # your code here
        raise NotImplementedError
