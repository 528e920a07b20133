"""The Megatron MLP (column-parallel fc1, ReLU, row-parallel fc2) on four ranks, against the dense MLP."""
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

class CopyToShards(torch.autograd.Function):      # f: forward nothing, backward all-reduce
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)
    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        calls.append(("backward", "all_reduce", grad.nbytes))
        dist.all_reduce(grad)
        return grad

class ReduceFromShards(torch.autograd.Function):  # g: forward all-reduce, backward nothing
    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        calls.append(("forward", "all_reduce", total.nbytes))
        dist.all_reduce(total)
        return total
    @staticmethod
    def backward(ctx, grad):
        return grad

def megatron_mlp(x, w1, b1, w2, b2):  # the columns fc1 makes here are exactly the inputs fc2 needs here: no gather
    local = torch.relu(F.linear(CopyToShards.apply(x), w1, b1))
    return ReduceFromShards.apply(F.linear(local, w2)) + b2

def grads(output, leaves):  # the gradients of sum(output · a fixed probe)
    probe = torch.linspace(-1, 1, output.numel(), dtype=output.dtype, device=device).view_as(output)
    return torch.autograd.grad((output * probe).sum(), leaves)

torch.manual_seed(0)  # the dense MLP: every rank builds the same one, and the same input (on the CPU)
fc1, fc2, x = torch.nn.Linear(32, 128), torch.nn.Linear(128, 32), torch.randn(16, 32)
gaps = {}
for dtype in (torch.float64, torch.float32):  # the same numbers twice: float64 holds every float32 exactly
    calls.clear()                             # keep the collectives of the float32 run
    dense = [t.detach().to(device, dtype).requires_grad_() for t in (x, fc1.weight, fc1.bias, fc2.weight, fc2.bias)]
    mine = lambda t, dim: t.detach().chunk(world, dim)[rank].clone().requires_grad_()
    xr, w1, b1, w2 = dense[0].detach().clone().requires_grad_(), mine(dense[1], 0), mine(dense[2], 0), mine(dense[3], 1)
    b2 = dense[4].detach().clone().requires_grad_()   # fc1 by rows, fc2 by columns, fc2's bias whole
    out = megatron_mlp(xr, w1, b1, w2, b2)
    ours = [out, *grads(out, [xr, w1, b1, w2, b2])]
    yd = F.linear(torch.relu(F.linear(*dense[:3])), *dense[3:])
    ref = [yd, *grads(yd, dense)]
    ref[2:5] = [ref[2].chunk(world, 0)[rank], ref[3].chunk(world, 0)[rank], ref[4].chunk(world, 1)[rank]]  # our shards
    names = ["output", "grad x", "grad fc1 weight", "grad fc1 bias", "grad fc2 weight", "grad fc2 bias"]
    gaps[str(dtype)[6:]] = {name: (a - b).abs().max().item() for name, a, b in zip(names, ours, ref)}
report(gaps=gaps, calls=calls)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
