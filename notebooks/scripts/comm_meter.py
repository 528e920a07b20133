"""Lesson 11's measuring instruments: bytes communicated, model state held, accuracy.

Written by a cell of 11_capstone.ipynb (edit the notebook, not this file).
"""
import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

NOT_MESSAGES = {"wait_tensor", "_wrap_tensor_autograd", "barrier", "recv_", "recv_any_source_"}  # a recv is counted at its send


class CountBytes(TorchDispatchMode):
    """Add up the bytes of every message this rank hands to torch.distributed while active.

    Every collective and every send, whether called by our code, by DDP's reducer, by FSDP, by
    DTensor or by a pipeline schedule, runs as an operator of the `c10d` or `_c10d_functional`
    namespace, and every operator passes through an active dispatch mode. A message's size is
    its largest tensor: the tensor of an all-reduce or a send, the gathered result of an
    all-gather, the unreduced input of a reduce-scatter (the `nbytes` of costmodel's ring formulas).
    """

    def __init__(self) -> None:
        super().__init__()
        self.reset()

    def reset(self) -> None:
        self.bytes, self.calls = 0, 0

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
    """Bytes of parameters, gradients and optimizer state this rank holds (its shards only)."""
    tensors = [_local(p) for p in parameters] + [_local(p.grad) for p in parameters if p.grad is not None]
    tensors += [_local(v) for state in optimizer.state.values() for v in state.values()
                if isinstance(v, torch.Tensor) and v.dim() > 0]  # AdamW's step counter is a 0-d tensor
    return sum(t.numel() * t.element_size() for t in tensors)


def peak_memory(device: torch.device) -> int | None:
    """Peak bytes allocated on this card since the last reset: GPUs only (None on simulated cards)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


@torch.no_grad()
def accuracy(model: torch.nn.Module, test_set, device: torch.device) -> float:
    """Fraction of the test set the model classifies right (every rank tests the whole set)."""
    model.eval()
    images, labels = test_set.tensors
    predicted = torch.cat([model(x.to(device)).argmax(1).cpu() for x in images.split(500)])
    return (predicted == labels).float().mean().item()
