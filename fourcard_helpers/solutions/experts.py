"""A reference solution for lesson 14's build exercise: an expert-parallel layer's forward from all-to-alls, the
counts first, then the tokens (uneven splits) and their results back."""
from __future__ import annotations

import torch
import torch.distributed as dist


def expert_dispatch(moe, x):
    """The output of the top-1 layer `moe` for this rank's tokens `x` (tokens, d), this rank running only its own
    experts (rank r: experts r·m to r·m + m − 1, m per rank): each token goes to its expert's card and back."""
    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = len(moe.experts) // world
    _, chosen, weights = moe.route(x)
    expert, weight = chosen[:, 0], weights[:, 0]
    order = torch.argsort(expert, stable=True)                 # my tokens grouped by expert, so by card
    send = torch.bincount(expert, minlength=len(moe.experts))   # my rows for each expert
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send)                     # the counts first: [s·m + j], rank s's rows for my j
    to_rank = send.view(world, per_rank).sum(1).tolist()       # my rows for each card: its m experts' rows added
    from_rank = received.view(world, per_rank).sum(1).tolist()  # each card's rows for my experts
    rows = x.new_empty(sum(from_rank), x.shape[1])
    dist.all_to_all_single(rows, x[order], from_rank, to_rank)  # the tokens: uneven splits
    pieces = list(rows.split(received.tolist()))               # one piece per (rank, my expert)
    for j in range(per_rank):                                  # each of my experts on all of its rows at once
        mine = moe.experts[rank * per_rank + j]
        pieces[j::per_rank] = mine(torch.cat(pieces[j::per_rank])).split(received[j::per_rank].tolist())
    results = x.new_empty(len(x), x.shape[1])
    dist.all_to_all_single(results, torch.cat(pieces), to_rank, from_rank)   # back, in the order they were sent
    out = torch.empty_like(x)
    out[order] = weight[order, None] * results                 # each result to its token's position
    return out
