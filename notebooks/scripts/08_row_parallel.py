"""Row-parallel linear layer by hand: each rank multiplies a quarter of the input features."""
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

class ReduceFromShards(torch.autograd.Function):
    """g: forward all-reduce (sum) the partial outputs; backward nothing (a sum's gradient reaches every term)."""
    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        calls.append(("forward", "all_reduce", total.nbytes))
        dist.all_reduce(total)
        return total
    @staticmethod
    def backward(ctx, grad):
        return grad

def grads(output, leaves):
    """Backpropagate a fixed probe through `output`: the gradients of sum(output · probe)."""
    probe = torch.linspace(-1, 1, output.numel(), dtype=output.dtype, device=device).view_as(output)
    return torch.autograd.grad((output * probe).sum(), leaves)

torch.manual_seed(0)  # the dense reference: every rank builds the same layer and input (on the CPU, as the notebook)
fc2, h = torch.nn.Linear(128, 32), torch.randn(16, 128)
gaps = {}
for dtype in (torch.float64, torch.float32):  # the same numbers twice: float64 holds every float32 exactly
    calls.clear()                             # keep the collectives of the float32 run
    W, b, hd = (t.detach().to(device, dtype) for t in (fc2.weight, fc2.bias, h))
    w2 = W.chunk(world, dim=1)[rank].clone().requires_grad_()  # columns = input features
    b2 = b.clone().requires_grad_()                            # whole on every rank
    hr = hd.chunk(world, dim=-1)[rank].clone().requires_grad_()   # this rank's quarter of the features
    z = ReduceFromShards.apply(F.linear(hr, w2)) + b2            # the bias is added once, after the sum
    gh, gw2, gb2 = grads(z, [hr, w2, b2])
    Wd, bd, hd = (t.clone().requires_grad_() for t in (W, b, hd))
    zd = F.linear(hd, Wd, bd)
    dh, dw2, db2 = grads(zd, [hd, Wd, bd])
    gaps[str(dtype)[6:]] = {"output": (z - zd).abs().max().item(),
                            "grad input slice": (gh - dh.chunk(world, -1)[rank]).abs().max().item(),
                            "grad weight shard": (gw2 - dw2.chunk(world, 1)[rank]).abs().max().item(),
                            "grad bias": (gb2 - db2).abs().max().item()}
report(gaps=gaps, calls=calls, weight_shape=list(w2.shape))
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
