import math

import torch
import torch.distributed as dist


def ring_attention(q, k, v):
    """Attention (not causal) of this rank's queries `q` (heads, block, d) to every rank's keys and values, of which
    this rank holds the block `k`, `v`: the blocks go round the ring, each merged into a running output as it comes."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # your code here: n - 1 shifts round the ring; per query a running max, sum and output
    raise NotImplementedError
