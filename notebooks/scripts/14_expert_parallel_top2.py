"""Lesson 14's expert parallel as production runs it: top-2 routing, a capacity that each rank applies to its own
tokens, and the load-balancing loss from the whole batch's statistics. 8 experts spread over the ranks, float64.
Reports each rank's output, its part of the loss, its gradients, and which of its assignments it kept."""
import os

import torch
import torch.distributed as dist

from fourcard_helpers import detect, report, exit_without_teardown
from fourcard_helpers.moe import MoE, expert_parallel, within_capacity

D, E, TOKENS, FACTOR, ALPHA = 64, 8, 256, 1.0, 0.01   # width, experts, tokens per rank, capacity factor, α
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
torch.manual_seed(0)
moe = MoE(D, E, top_k=2, capacity_factor=FACTOR).to(device, torch.float64)   # one card's layer on every rank
x_all, target = torch.randn(2, world * TOKENS, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
mine = slice(rank * TOKENS, (rank + 1) * TOKENS)   # this rank's part of the batch
x = x_all[mine].to(device).requires_grad_()
out, received = expert_parallel(moe, x)            # each rank drops by its own capacity, in its own tokens' order
probabilities, chosen, _ = moe.route(x)
counts = torch.bincount(chosen.flatten(), minlength=E).to(torch.float64)   # this rank's assignments per expert
dist.all_reduce(counts)                            # the batch's: every rank now holds the same counts
f = counts / counts.sum()                          # the batch's fractions f_e (counts: no gradient)
balance = E * (f * probabilities.sum(0)).sum() / (world * TOKENS)   # this rank's part of E · Σ f_e · P_e
loss = (out * target[mine].to(device)).sum() / (world * TOKENS) + ALPHA * balance   # its part of the batch's loss
loss.backward()
for p in moe.router.parameters():                  # the router's gradient: the ranks' parts, added
    dist.all_reduce(p.grad)
totals = torch.stack([loss.detach(), balance.detach()])
dist.all_reduce(totals)                            # the batch's loss and balancing loss: the parts added
experts = range(rank * E // world, (rank + 1) * E // world)
report(setting=[TOKENS, FACTOR, ALPHA], out=out, x_grad=x.grad, loss=totals[0].item(), balance=totals[1].item(),
       kept=within_capacity(chosen, E, FACTOR), router_grad=[p.grad for p in moe.router.parameters()],
       expert_grads={e: [p.grad for p in moe.experts[e].parameters()] for e in experts})
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
