"""Lesson 11's measuring instruments: bytes sent, model state held, a clock, the weights, accuracy.

Written by a cell of 11_capstone.ipynb (edit the notebook, not this file).
"""
import time

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

NOT_MESSAGES = {"wait_tensor", "_wrap_tensor_autograd", "barrier", "recv_", "recv_any_source_"}  # a recv is counted at its send


class CountBytes(TorchDispatchMode):
    """Add up the bytes of every message this rank sends through torch.distributed while active.

    Every collective and every send, whether called by our code, by DDP's reducer, by FSDP, by
    DTensor or by a pipeline schedule, runs as an operator of the `c10d` or `_c10d_functional`
    namespace, and every operator passes through an active dispatch mode. Receives are left out
    (a message is counted once, at its send). A message's size is its largest tensor: the tensor
    of an all-reduce or a send, the unreduced input of a reduce-scatter, and the gathered output
    of an all-gather that is handed one (`_allgather_base_`, the form FSDP2 uses): the `nbytes`
    of costmodel's ring formulas. The other all-gather forms (`allgather_` with a list of shards,
    `_c10d_functional.all_gather_into_tensor`) are handed only shards and would be counted at one
    shard's size; none of lesson 11's counted steps calls them.
    """

    def __init__(self) -> None:
        super().__init__()
        self.reset()

    def reset(self) -> tuple[int, int]:
        """Start counting from zero; return (bytes, messages) counted until now."""
        counted = getattr(self, "bytes", 0), getattr(self, "calls", 0)
        self.bytes, self.calls = 0, 0
        return counted

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in ("c10d", "_c10d_functional") and func._opname not in NOT_MESSAGES:
            sizes = [t.numel() * t.element_size() for t in _tensors(args)]
            if sizes:
                self.bytes += max(sizes)
                self.calls += 1
        return func(*args, **(kwargs or {}))


def _tensors(value):
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, torch.Tensor):
        yield value


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def model_state_bytes(parameters: list, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of parameters, of the gradients still held, and of optimizer state on this rank (its shards only).

    Called after optimizer.zero_grad(), which frees the gradients (sets them to None): the count is then
    parameters and optimizer state. During backward a card holds gradients the size of its parameters too.
    """
    tensors = [_local(p) for p in parameters] + [_local(p.grad) for p in parameters if p.grad is not None]
    tensors += [_local(v) for state in optimizer.state.values() for v in state.values()
                if isinstance(v, torch.Tensor) and v.dim() > 0]  # AdamW's step counter is a 0-d tensor
    return sum(t.numel() * t.element_size() for t in tensors)


def clock(device: torch.device) -> float:
    """time.perf_counter(), read once the card has finished its queued work.

    A GPU runs asynchronously: without the synchronize, the clock would stop before the work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def peak_memory(device: torch.device) -> int | None:
    """Peak bytes allocated on this card since the last reset: GPUs only (None on simulated cards)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def flat_weights(model: torch.nn.Module, keep: bool = True) -> torch.Tensor | None:
    """All the model's weights as one vector, sharded ones gathered (so every rank must call it, even those
    with keep=False, which get None: the ranks that need not report them)."""
    whole = [p.full_tensor() if isinstance(p, DTensor) else p for p in model.parameters()]
    return torch.cat([p.detach().flatten().cpu() for p in whole]) if keep else None


@torch.no_grad()
def accuracy(model: torch.nn.Module, test_set, device: torch.device) -> float:
    """Fraction of the test set the model classifies right (every rank tests the whole set)."""
    model.eval()
    images, labels = test_set.tensors
    dtype = next(model.parameters()).dtype  # the digits in the model's precision (float32, or float64)
    predicted = torch.cat([model(x.to(device, dtype)).argmax(1).cpu() for x in images.split(500)])
    return (predicted == labels).float().mean().item()
