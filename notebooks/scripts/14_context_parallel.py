"""PyTorch's own context parallelism on four ranks: `context_parallel` cuts the queries, keys and values along the
sequence (balanced: a front and a back chunk per rank) and runs `scaled_dot_product_attention` blockwise, merging by
the log-sum-exp rule. Causal, float32, forward and backward, against one card in float64 and in float32. In torch
2.13 only the GPU's attention kernels have its sharding rules: on a CPU it reports the error it meets instead."""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import context_parallel_unshard
from torch.nn.attention import SDPBackend, sdpa_kernel

from fourcard_helpers import detect, report, exit_without_teardown

T, HEADS, HEAD_DIM = 1024, 4, 64
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
mesh = init_device_mesh(cards.kind, (world,))
torch.manual_seed(0)  # the same sequence on every rank; context_parallel gives each its part
q, k, v, grad_out = (torch.randn(1, HEADS, T, HEAD_DIM).to(device) for _ in range(4))


def one_card(dtype: torch.dtype) -> list[torch.Tensor]:
    """The output and the gradients of q, k and v, computed whole on this card."""
    inputs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*inputs, is_causal=True)
    (out * grad_out.to(dtype)).sum().backward()
    return [out.detach()] + [t.grad for t in inputs]


with sdpa_kernel(SDPBackend.MATH):
    exact = one_card(torch.float64)                        # the yardstick: float64's rounding is negligible here
parts = [t.clone() for t in (q, k, v, grad_out)]
try:
    with context_parallel(mesh, buffers=parts, buffer_seq_dims=[2, 2, 2, 2], no_restore_buffers=set(parts)):
        for t in parts[:3]:
            t.requires_grad_()
        out = F.scaled_dot_product_attention(*parts[:3], is_causal=True)   # this rank's part of the sequence
        (out * parts[3]).sum().backward()
        whole = context_parallel_unshard(mesh, [out.detach()] + [t.grad for t in parts[:3]], [2, 2, 2, 2])
    names = ("out", "dq", "dk", "dv")
    gaps = {"context parallel": {n: (a.double() - b).abs().max().item() for n, a, b in zip(names, whole, exact)},
            "one card, float32": {n: (a.double() - b).abs().max().item() for n, a, b in zip(names, one_card(torch.float32), exact)}}
    report(gaps=gaps)
except NotImplementedError as error:
    report(error=f"{type(error).__name__}: {str(error).splitlines()[0]}")
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)


