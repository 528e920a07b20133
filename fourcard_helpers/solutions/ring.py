"""A reference solution for lesson 06's build exercise: ring all-reduce from send/recv alone, for any length."""
from __future__ import annotations

import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    """Sum the 1-D `tensor` over all ranks, in place: reduce-scatter, then all-gather, around a ring."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.tensor_split(world))  # `world` views; lengths differ by one at most, some may be empty
    right, left = (rank + 1) % world, (rank - 1) % world

    def exchange(outgoing, incoming):
        # The send and the receive start together, so no rank waits for a neighbour that waits too
        # (on NCCL a send may not finish until its receive is posted: the two must go in one batch).
        for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, outgoing, right),
                                               dist.P2POp(dist.irecv, incoming, left)]):
            request.wait()

    for step in range(world - 1):             # reduce-scatter: add the left neighbour's partial sum to ours
        send, recv = (rank - step) % world, (rank - step - 1) % world
        incoming = torch.empty_like(chunks[recv])
        exchange(chunks[send], incoming)
        chunks[recv] += incoming
    for step in range(world - 1):             # all-gather: rank r now holds the whole sum of chunk r + 1
        send, recv = (rank + 1 - step) % world, (rank - step) % world
        exchange(chunks[send], chunks[recv])
    return tensor
