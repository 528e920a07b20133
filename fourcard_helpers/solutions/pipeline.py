"""A reference solution for lesson 07's build exercise: the 1F1B schedule, driven by hand with send/recv."""
from __future__ import annotations

import torch
import torch.distributed as dist


def one_f_one_b(stage, inputs, targets, micro_batches, shape, loss_fn):
    """One training step of this rank's `stage` with the 1F1B schedule; the batch's loss on the last rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    like = next(stage.parameters())                       # received activations get the stage's dtype and device
    xs = inputs.chunk(micro_batches) if first else None
    ts = targets.chunk(micro_batches) if last else None
    held, losses, sends = {}, [], []                      # held: micro-batch -> (input, output), until its backward

    def forward(i):
        if first:
            x = xs[i]
        else:
            x = torch.empty(shape, dtype=like.dtype, device=like.device)
            dist.recv(x, rank - 1)
            x.requires_grad_()
        y = stage(x)
        if last:
            y = loss_fn(y, ts[i]) / micro_batches         # each micro-batch's share of the batch's mean loss
            losses.append(y.detach())
        else:
            sends.append(dist.isend(y.detach(), rank + 1))  # not blocking: the neighbour may be sending to us
        held[i] = (x, y)

    def backward(i):
        x, y = held.pop(i)                                # this micro-batch's activations are freed after this
        if last:
            y.backward()
        else:
            grad = torch.empty_like(y)
            dist.recv(grad, rank + 1)
            y.backward(grad)
        if not first:
            sends.append(dist.isend(x.grad, rank - 1))

    warmup = min(world - 1 - rank, micro_batches)         # forwards before the first backward
    for i in range(warmup):
        forward(i)
    for i in range(micro_batches - warmup):               # steady state: one forward, one backward
        forward(warmup + i)
        backward(i)
    for i in range(micro_batches - warmup, micro_batches):  # cool-down: the backwards left
        backward(i)
    for request in sends:
        request.wait()
    return torch.stack(losses).sum() if last else None
