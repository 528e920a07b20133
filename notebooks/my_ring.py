import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    """Sum the 1-D `tensor` over all ranks, in place, and return it: a reduce-scatter, then an all-gather,
    around a ring, with dist.send, dist.recv, dist.isend and dist.irecv only. Any length, 1 included."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # your code here
    raise NotImplementedError
