"""A reference solution for lesson 10's build exercise: clip gradients sharded across the ranks by the norm of the
whole gradient, as torch.nn.utils.clip_grad_norm_ clips a gradient held whole."""
from __future__ import annotations

import torch
import torch.distributed as dist


def clip_sharded_grad_norm_(shards, max_norm, group=None):
    """Scale this rank's shards (its piece of each gradient, maybe empty) in place as clip_grad_norm_ scales whole
    gradients, and return the whole gradient's norm, the same on every rank."""
    squares = torch.stack([shard.pow(2).sum() for shard in shards]).sum()  # this rank's part of the sum of squares
    dist.all_reduce(squares, group=group)  # one number per rank: the whole gradient's sum of squares
    total = squares.sqrt()
    factor = (max_norm / (total + 1e-6)).clamp(max=1.0)  # clip_grad_norm_'s rule: scale down, never up
    for shard in shards:
        shard.mul_(factor)
    return total
