import torch
import torch.distributed as dist


def one_f_one_b(stage, inputs, targets, micro_batches, shape, loss_fn):
    """One training step of this rank's `stage` with the 1F1B schedule.

    inputs: the whole batch on the first rank, None elsewhere; targets: the batch's targets on the last
    rank, None elsewhere; shape: the shape of one micro-batch's activation between stages. Returns the
    batch's mean loss on the last rank (None elsewhere) and leaves its gradient in every parameter's .grad."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # your code here
    raise NotImplementedError
