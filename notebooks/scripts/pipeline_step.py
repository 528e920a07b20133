"""One pipelined training step on this rank (lesson 07): run a schedule's order of forwards and backwards."""
import time
import torch
import torch.distributed as dist
import torch.nn.functional as F


class Links:
    """Point-to-point traffic of this stage. A send is not started at once: it waits for the
    next receive from the same neighbour and goes in one batch with it, so two neighbours
    that send to each other at the same moment (1F1B does) never wait for each other."""

    def __init__(self, device, dtype):
        self.device, self.dtype, self.pending, self.started = device, dtype, [], []

    def send(self, tensor, peer):
        self.pending.append(dist.P2POp(dist.isend, tensor.contiguous(), peer))

    def recv(self, shape, peer):
        self.flush([op for op in self.pending if op.peer != peer])  # sends to the other side go on their own
        buffer = torch.empty(shape, device=self.device, dtype=self.dtype)
        works = dist.batch_isend_irecv(self.pending + [dist.P2POp(dist.irecv, buffer, peer)])
        works[-1].wait()
        self.started, self.pending = self.started + works[:-1], []
        return buffer

    def flush(self, ops=None):
        ops = list(self.pending) if ops is None else ops
        self.pending = [op for op in self.pending if op not in ops]
        if ops:
            self.started += dist.batch_isend_irecv(ops)

    def finish(self):
        self.flush()
        for work in self.started:
            work.wait()
        self.started = []


def train_step(stage, order, x, y, micro_batches, input_shape, device, pace=None, now=time.perf_counter):
    """Run this rank's `order` of ("F", i) / ("B", i) on one batch cut into `micro_batches`.

    x (first rank) and y (last rank) are the whole batch, and every rank receives in x's dtype;
    `input_shape` is the shape of one sample where this stage's input comes in. With
    `pace=(forward_s, backward_s)` every operation computes, then sleeps until its slot has passed. Returns the events
    (start, end, cpu_seconds, kind, micro-batch) and the most micro-batches held at once.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    xs, ys = x.chunk(micro_batches), y.chunk(micro_batches)
    links, held, peak, events = Links(device, x.dtype), {}, 0, []
    for op, i in order:
        if op == "F":
            if first:
                links.flush()  # nothing to receive: start the pending sends now
                inputs = xs[i]
            else:
                inputs = links.recv((len(ys[i]), *input_shape), rank - 1).requires_grad_()
            start, cpu = now(), time.process_time()
            outputs = stage(inputs)
            if last:  # the loss of micro-batch i, weighted so that the sum is the batch mean
                outputs = F.cross_entropy(outputs, ys[i]) / micro_batches
            held[i] = (inputs, outputs)  # kept until its backward: these are the activations
            peak = max(peak, len(held))
        else:
            inputs, outputs = held.pop(i)
            if last:
                links.flush()
            grad = None if last else links.recv(outputs.shape, rank + 1)  # the loss starts the backward
            start, cpu = now(), time.process_time()
            outputs.backward(grad)
        cpu = time.process_time() - cpu
        if pace:
            time.sleep(max(0.0, start + (pace[0] if op == "F" else pace[1]) - now()))
        events.append((start, now(), cpu, "forward" if op == "F" else "backward", i))
        if op == "F" and not last:
            links.send(outputs.detach(), rank + 1)
        if op == "B" and not first:
            links.send(inputs.grad, rank - 1)
    links.finish()
    return events, peak
