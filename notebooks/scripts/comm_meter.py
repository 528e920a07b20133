"""Measuring instruments for lesson 11's launches: bytes communicated, model state held, accuracy.

Kept out of the launch cells because they measure the strategies, they are not one of them.
"""
import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

SKIP = {"wait_tensor", "_wrap_tensor_autograd", "recv_", "recv_any_source_", "barrier"}  # not messages, or counted at the sender


class CountBytes(TorchDispatchMode):
    """Add up the bytes of every message this rank hands to torch.distributed while active.

    Every collective and every send, whether called by our code, by DDP's reducer, by FSDP,
    by DTensor or by a pipeline schedule, goes through an operator of the `c10d` or
    `_c10d_functional` namespace; this mode sees each one. A message's size is its largest
    tensor: the tensor of an all-reduce or a send, the gathered result of an all-gather, the
    unreduced input of a reduce-scatter (what the ring formulas of costmodel take as nbytes).
    """

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in ("c10d", "_c10d_functional") and func._opname not in SKIP:
            tensors = [a for a in _flatten(args) if isinstance(a, torch.Tensor)]
            if tensors:
                self.bytes += max(t.numel() * t.element_size() for t in tensors)
                self.calls += 1
        return func(*args, **(kwargs or {}))


def _flatten(value):
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _flatten(item)
    else:
        yield value


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def model_state_bytes(parameters: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> int:
    """Bytes of parameters, gradients and optimizer state this rank holds (its shards only).

    On simulated cards this is the only per-card memory figure there is (CPU processes have no
    per-device allocator to ask); on GPUs the launches report torch.cuda.max_memory_allocated too.
    """
    tensors = [_local(p) for p in parameters] + [_local(p.grad) for p in parameters if p.grad is not None]
    tensors += [_local(v) for state in optimizer.state.values() for v in state.values()
                if isinstance(v, torch.Tensor) and v.dim() > 0]
    return sum(t.numel() * t.element_size() for t in tensors)


def peak_memory(device: torch.device) -> int | None:
    """Peak bytes allocated on this card since the last reset (GPUs only; None on simulated cards)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


@torch.no_grad()
def accuracy(model: torch.nn.Module, test_set, device: torch.device) -> float:
    """Fraction of the test set the model classifies right (every rank sees the whole set)."""
    model.eval()
    images, labels = test_set.tensors
    predicted = torch.cat([model(x.to(device)).argmax(1).cpu() for x in images.split(500)])
    return (predicted == labels).float().mean().item()
