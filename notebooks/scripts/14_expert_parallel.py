"""Lesson 14's expert parallel: a mixture of 8 experts, 2 on each of 4 ranks (rank r holds experts 2r and 2r + 1).
Each rank routes its quarter of a batch of tokens with its replica of the router; two all-to-alls carry every token
to its expert's rank and the result back. Float64, no capacity. Reports each rank's output, its gradients, and the
bytes each all-to-all (and all-reduce) of forward and backward sent to each rank."""
import math
import os

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from fourcard_helpers import detect, report, exit_without_teardown
from fourcard_helpers.moe import MoE, expert_parallel

class Collectives(TorchDispatchMode):          # every collective passes through as an operator: note its bytes
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._opname in ("alltoall_base_", "all_to_all_single"):   # dist.all_to_all_single; the differentiable one
            tensor, splits = (args[1], args[4]) if func._opname == "alltoall_base_" else (args[0], args[2])
            row = tensor.element_size() * math.prod(tensor.shape[1:])         # bytes of one row
            splits = splits or [tensor.shape[0] // dist.get_world_size()] * dist.get_world_size()
            self.seen.append(("all-to-all", [n * row for n in splits]))      # bytes for each rank, its own included
        elif func._opname == "allreduce_":
            self.seen.append(("all-reduce", args[0][0].nbytes))
        return func(*args, **(kwargs or {}))

D, E, TOKENS = 64, 8, 256                     # width, experts, tokens per rank
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
torch.manual_seed(0)
moe = MoE(D, E).to(device, torch.float64)    # one card's layer on every rank; each runs only its own two experts
x_all, target = torch.randn(2, world * TOKENS, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
mine = slice(rank * TOKENS, (rank + 1) * TOKENS)   # this rank's quarter of the batch
x = x_all[mine].to(device).requires_grad_()
with Collectives() as counted:
    counted.seen = []
    out, received = expert_parallel(moe, x)
    loss = (out * target[mine].to(device)).sum() / (world * TOKENS)   # this rank's share of the batch's loss
    loss.backward()
    for p in moe.router.parameters():       # the router's gradient: the four ranks' shares, added
        dist.all_reduce(p.grad)
experts = range(rank * E // world, (rank + 1) * E // world)
report(tokens=TOKENS, out=out, x_grad=x.grad, received=received, collectives=counted.seen,
       expert_grads={e: torch.cat([p.grad.flatten() for p in moe.experts[e].parameters()]) for e in experts},
       router_grad=torch.cat([p.grad.flatten() for p in moe.router.parameters()]) if rank == 0 else None)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
