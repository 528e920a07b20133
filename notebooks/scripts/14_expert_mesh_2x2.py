"""Lesson 14's experts on a 2 × 2 mesh: two expert-parallel groups of 2 ranks, each group holding all 8 experts (4
on each rank), and two data-parallel copies of every expert. Top-2, a capacity per rank, the balancing loss of the
whole batch, as the previous launch; the all-to-alls stay inside a rank's expert group, and each expert's gradient is
all-reduced over the data dimension, with its copy. Float64. Reports each rank's output, loss and gradients."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from fourcard_helpers import detect, report, exit_without_teardown
from fourcard_helpers.moe import MoE, expert_parallel

D, E, TOKENS, FACTOR, ALPHA = 64, 8, 256, 1.0, 0.01   # width, experts, tokens per rank, capacity factor, α
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
mesh = init_device_mesh(cards.kind, (world // 2, 2), mesh_dim_names=("data", "expert"))   # rank = 2 · data + expert
torch.manual_seed(0)
moe = MoE(D, E, top_k=2, capacity_factor=FACTOR).to(device, torch.float64)   # one card's layer on every rank
x_all, target = torch.randn(2, world * TOKENS, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
mine = slice(rank * TOKENS, (rank + 1) * TOKENS)   # this rank's part of the batch
x = x_all[mine].to(device).requires_grad_()
out, _ = expert_parallel(moe, x, mesh.get_group("expert"))   # the tokens travel within this rank's expert group
probabilities, chosen, _ = moe.route(x)
counts = torch.bincount(chosen.flatten(), minlength=E).to(torch.float64)
dist.all_reduce(counts)                            # over all the ranks: the whole batch's counts
f = counts / counts.sum()
balance = E * (f * probabilities.sum(0)).sum() / (world * TOKENS)   # this rank's part of E · Σ f_e · P_e
loss = (out * target[mine].to(device)).sum() / (world * TOKENS) + ALPHA * balance
loss.backward()
for p in moe.router.parameters():                  # the router: a copy on every rank, its parts added over all
    dist.all_reduce(p.grad)
per_rank = E // mesh.size(1)
experts = range(mesh.get_local_rank("expert") * per_rank, (mesh.get_local_rank("expert") + 1) * per_rank)
for e in experts:                                  # my experts: a copy on each rank of my data group, each with the
    for p in moe.experts[e].parameters():          # gradient of the tokens its expert group sent it: added
        dist.all_reduce(p.grad, group=mesh.get_group("data"))
totals = torch.stack([loss.detach(), balance.detach()])
dist.all_reduce(totals)                            # the batch's loss and balancing loss: the parts added
report(out=out, loss=totals[0].item(), balance=totals[1].item(), router_grad=[p.grad for p in moe.router.parameters()],
       expert_grads={e: [p.grad for p in moe.experts[e].parameters()] for e in experts})
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
