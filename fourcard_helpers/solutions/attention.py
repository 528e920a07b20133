"""A reference solution for lesson 14's build exercise: ring attention's forward, from send/recv and the online
softmax. Each step's send and receive are posted together with `batch_isend_irecv`: on gloo posting them one after the
other is enough, on NCCL a send posted alone may wait for its receive, and the ring waits for ever."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist


def ring_attention(q, k, v):
    """Attention (not causal) of this rank's queries `q` (heads, block, d) to every rank's keys and values, of which
    this rank holds the block `k`, `v`: the blocks go round the ring, each merged into a running output as it comes."""
    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    kv = torch.stack([k, v])                          # keys and values travel together, one message a step
    top = torch.full_like(q[..., :1], float("-inf"))  # each query's largest score so far
    total = torch.zeros_like(top)                     # the sum of exp(score - top) over the keys so far
    out = torch.zeros_like(q)                         # the sum of exp(score - top) × value over the keys so far
    for step in range(world):
        if step < world - 1:                          # post the next block's transfer, then compute on this one
            incoming = torch.empty_like(kv)
            transfer = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, right),        # the pair posted as one:
                                               dist.P2POp(dist.irecv, incoming, left)])  # on NCCL a lone send may wait
        scores = q @ kv[0].transpose(-2, -1) / math.sqrt(q.shape[-1])
        new_top = torch.maximum(top, scores.amax(-1, keepdim=True))
        rescale = torch.exp(top - new_top)            # what the sums so far are worth under the new largest score
        weights = torch.exp(scores - new_top)
        total = total * rescale + weights.sum(-1, keepdim=True)
        out = out * rescale + weights @ kv[1]
        top = new_top
        if step < world - 1:
            for request in transfer:
                request.wait()
            kv = incoming                             # the block just used is dropped: two blocks held at most
    return out / total
