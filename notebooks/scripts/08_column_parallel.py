"""Column-parallel linear layer by hand: each rank makes a quarter of the output features."""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from fourcard_helpers import detect, report, exit_without_teardown

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
calls = []  # every collective this rank calls: (pass, name, payload bytes)

class CopyToShards(torch.autograd.Function):
    """f: forward nothing (every rank has x); backward all-reduce ∂loss/∂x, to which each shard adds a part."""
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)
    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        calls.append(("backward", "all_reduce", grad.nbytes))
        dist.all_reduce(grad)
        return grad

class GatherFromShards(torch.autograd.Function):
    """Forward: all-gather the column slices into the full output. Backward: keep this rank's slice."""
    @staticmethod
    def forward(ctx, local):
        pieces = [torch.empty_like(local) for _ in range(world)]
        calls.append(("forward", "all_gather", local.nbytes * world))
        dist.all_gather(pieces, local.contiguous())
        return torch.cat(pieces, dim=-1)
    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(world, dim=-1)[rank].contiguous()

def grads(output, leaves):  # the gradients of sum(output · probe), for a fixed probe
    probe = torch.linspace(-1, 1, output.numel(), dtype=output.dtype, device=device).view_as(output)
    return torch.autograd.grad((output * probe).sum(), leaves)

torch.manual_seed(0)  # the dense reference: every rank builds the same layer and input (on the CPU, as the notebook)
fc1, x = torch.nn.Linear(32, 128), torch.randn(16, 32)
gaps = {}
for dtype in (torch.float64, torch.float32):  # the same numbers twice: float64 holds every float32 exactly
    calls.clear()                             # keep the collectives of the float32 run
    W, b, xd = (t.detach().to(device, dtype) for t in (fc1.weight, fc1.bias, x))
    w1, b1 = (t.chunk(world, dim=0)[rank].clone().requires_grad_() for t in (W, b))  # rows = output features
    xr = xd.clone().requires_grad_()
    y = GatherFromShards.apply(F.linear(CopyToShards.apply(xr), w1, b1))
    gx, gw1, gb1 = grads(y, [xr, w1, b1])
    Wd, bd, xd = (t.clone().requires_grad_() for t in (W, b, xd))
    yd = F.linear(xd, Wd, bd)
    dx, dw1, db1 = grads(yd, [xd, Wd, bd])
    gaps[str(dtype)[6:]] = {"output": (y - yd).abs().max().item(), "grad x": (gx - dx).abs().max().item(),
                            "grad weight shard": (gw1 - dw1.chunk(world, 0)[rank]).abs().max().item(),
                            "grad bias shard": (gb1 - db1.chunk(world, 0)[rank]).abs().max().item()}
report(gaps=gaps, calls=calls, weight_shape=list(w1.shape))
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
