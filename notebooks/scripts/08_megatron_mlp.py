"""The Megatron MLP (column-parallel fc1, ReLU, row-parallel fc2) on four ranks, against the dense MLP."""
import os, torch, torch.distributed as dist, sys
import torch.nn.functional as F
from fourcard_helpers import detect, report

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

torch.manual_seed(0)
fc1, fc2 = torch.nn.Linear(32, 128).to(device), torch.nn.Linear(128, 32).to(device)
x = torch.randn(16, 32, device=device)
mine = lambda t, dim: t.detach().chunk(world, dim)[rank].clone().requires_grad_()
w1, b1, w2 = mine(fc1.weight, 0), mine(fc1.bias, 0), mine(fc2.weight, 1)   # fc1 by rows, fc2 by columns
b2 = fc2.bias.detach().clone().requires_grad_()

def megatron_mlp(x):  # the columns fc1 makes here are exactly the inputs fc2 needs here: no gather between
    local = torch.relu(F.linear(CopyToShards.apply(x), w1, b1))
    return ReduceFromShards.apply(F.linear(local, w2)) + b2

def grads(output, leaves):  # the gradients of sum(output · a fixed probe)
    probe = torch.linspace(-1, 1, output.numel(), device=device).view_as(output)
    return torch.autograd.grad((output * probe).sum(), leaves)

xr, xd = x.clone().requires_grad_(), x.clone().requires_grad_()
out, dense = megatron_mlp(xr), fc2(torch.relu(fc1(xd)))
ours = [out, *grads(out, [xr, w1, b1, w2, b2])]
ref = [dense, *grads(dense, [xd, fc1.weight, fc1.bias, fc2.weight, fc2.bias])]
ref[2:5] = [ref[2].chunk(world, 0)[rank], ref[3].chunk(world, 0)[rank], ref[4].chunk(world, 1)[rank]]  # our shards
names = ["output", "grad x", "grad fc1 weight", "grad fc1 bias", "grad fc2 weight", "grad fc2 bias"]
gaps = {name: (a - b).abs().max().item() for name, a, b in zip(names, ours, ref)}
report(gaps=gaps, calls=calls)
dist.destroy_process_group()
sys.stdout.flush(); os._exit(0)  # skip Python's teardown, which can abort a gloo rank (lesson 00)
