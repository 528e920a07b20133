"""Data parallelism by hand: DDP's overlapped all-reduce, then its buckets (lesson 05's build exercises).

Each class is the reference solution of a build exercise (fourcard_helpers/exercises), and the text
of the lesson's hidden solution cell (tests/process/test_exercises.py keeps the two equal). They run in any
process group their caller made (gloo or NCCL, any number of ranks) and are compared with PyTorch's
DistributedDataParallel in tests/lessons/test_solutions.py.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn


def _unused(names):
    """What went wrong when backward left parameters without a gradient, and what to do."""
    return (f"no gradient reached {', '.join(names)} in this backward, so no all-reduce was sent for it; a rank "
            "that did send one has no partner for it: it waits until the time limit, or its all-reduce meets the "
            "next one this rank sends (gloo pairs them in order), which fails on their sizes or, where the sizes "
            "match, adds the wrong gradients. Likely cause: the forward did not use "
            "it (on this rank, or on every rank). Fix: use every parameter in every forward, or freeze the unused "
            "ones (requires_grad_(False)) before wrapping the model.")


class OverlappedDDP(nn.Module):
    """DDP by hand: each gradient's all-reduce starts as soon as backward has accumulated it. Every parameter
    that requires a gradient must get one in every step: an unused one fires no hook, so its all-reduce is never
    sent, and finish() says so (DDP needs find_unused_parameters=True there)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)  # every rank starts from rank 0's weights
        self.pending = []
        self.syncing = True
        for param in module.parameters():
            if param.requires_grad:  # fires once per step, after every use has added its share
                param.register_post_accumulate_grad_hook(self._launch)

    def _launch(self, param: torch.Tensor) -> None:
        if self.syncing:
            self.pending.append((param, dist.all_reduce(param.grad, async_op=True)))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Micro-batches before the last: gradients only accumulate, nothing is sent."""
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True

    def finish(self) -> None:
        """After backward, before the optimizer's step: wait for every all-reduce, then average."""
        sent = {id(param) for param, _work in self.pending}
        missing = [name for name, param in self.module.named_parameters() if param.requires_grad
                   and id(param) not in sent]
        if missing:
            raise RuntimeError(_unused(missing))
        for param, work in self.pending:
            work.wait()
            param.grad /= dist.get_world_size()
        self.pending.clear()


class BucketedDDP(nn.Module):
    """DDP by hand with buckets: gradients packed, in the order backward produces them, into buckets
    of about bucket_mb MiB; a bucket's one all-reduce starts when its last gradient is ready. Buckets go out in
    the order they fill, the same on every rank as backward's order is; DDP launches them in bucket order. As in
    OverlappedDDP, every parameter that requires a gradient must get one in every step (finish() checks)."""

    def __init__(self, module: nn.Module, bucket_mb: float = 25.0):
        super().__init__()
        self.module = module
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)
        cap = bucket_mb * 2**20
        self.buckets = [[]]
        size = 0
        for param in reversed([p for p in module.parameters() if p.requires_grad]):  # backward's order
            if size >= cap:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(param)
            size += param.numel() * param.element_size()
        self.bucket_of = {param: k for k, bucket in enumerate(self.buckets) for param in bucket}
        self.ready = [set() for _ in self.buckets]  # the parameters of each bucket whose gradient is in
        self.pending = []
        for param in self.bucket_of:
            param.register_post_accumulate_grad_hook(self._arrived)

    def _arrived(self, param: torch.Tensor) -> None:
        k = self.bucket_of[param]
        self.ready[k].add(param)
        if len(self.ready[k]) == len(self.buckets[k]):  # the bucket's last gradient: send the bucket
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[k]])
            self.pending.append((k, flat, dist.all_reduce(flat, async_op=True)))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        """Wait for every bucket, average, and copy each gradient back from its bucket."""
        missing = [name for name, param in self.module.named_parameters()
                   if param in self.bucket_of and param not in self.ready[self.bucket_of[param]]]
        if missing:
            raise RuntimeError(_unused(missing))
        for k, flat, work in self.pending:
            work.wait()
            flat /= dist.get_world_size()
            offset = 0
            for param in self.buckets[k]:
                param.grad.copy_(flat[offset:offset + param.numel()].view_as(param.grad))
                offset += param.numel()
        self.pending.clear()
        self.ready = [set() for _ in self.buckets]

