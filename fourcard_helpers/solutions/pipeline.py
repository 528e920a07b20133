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
    before, after = (None if first else rank - 1), (None if last else rank + 1)  # the neighbouring stages
    held, losses = {}, []                                 # held: micro-batch -> (input, output), until its backward

    def p2p(send=None, to=None, receive_from=None):
        # Send to and/or receive one activation-shaped tensor from a neighbour, started together: two
        # neighbours that send to each other at once (1F1B's steady state) must pair them in one batch,
        # since on NCCL a send may not finish before its receive is posted.
        ops = [] if send is None else [dist.P2POp(dist.isend, send, to)]
        buffer = None
        if receive_from is not None:
            buffer = torch.empty(shape, dtype=like.dtype, device=like.device)
            ops.append(dist.P2POp(dist.irecv, buffer, receive_from))
        for request in dist.batch_isend_irecv(ops) if ops else []:
            request.wait()
        return buffer

    def forward(i, x):                                    # x: the received activation (None on the first stage)
        x = xs[i] if first else x.requires_grad_()
        y = stage(x)
        if last:
            y = loss_fn(y, ts[i]) / micro_batches         # each micro-batch's share of the batch's mean loss
            losses.append(y.detach())
        held[i] = (x, y)
        return None if last else y.detach()               # what goes to the next stage

    def backward(i, grad):                                # grad: the received gradient (None on the last stage)
        x, y = held.pop(i)                                # this micro-batch's activations are freed after this
        y.backward(grad)
        return None if first else x.grad                  # what goes back to the stage before

    warmup = min(world - 1 - rank, micro_batches)         # forwards before the first backward
    for i in range(warmup):
        p2p(forward(i, p2p(receive_from=before)), after)
    x = p2p(receive_from=before) if warmup < micro_batches else None
    for i in range(micro_batches - warmup):               # steady state: one forward, one backward
        grad = p2p(forward(warmup + i, x), after, receive_from=after)   # output out, its gradient back: one batch
        more = warmup + i + 1 < micro_batches
        x = p2p(backward(i, grad), before, receive_from=before if more else None)  # gradient out, next input in
    for i in range(micro_batches - warmup, micro_batches):  # cool-down: the backwards left
        p2p(backward(i, p2p(receive_from=after)), before)
    return torch.stack(losses).sum() if last else None
