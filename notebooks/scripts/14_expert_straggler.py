"""Lesson 14's straggler: the expert-parallel layer's forward and backward, timed on every rank, with the router as
it starts (roughly even) and tilted toward expert 0 (on rank 0). Reports, for each routing, the rows each rank's
experts received, and per repeat the step's time and the time of the same expert work done alone, with no
communication: the step's compute. Then the cost model's measurements: all-reduces of 16 KiB to 4 MiB, and an
all-to-all as an even router's dispatch sends it (each rank's rows, a quarter to each rank). Float64."""
import os
import time

import torch
import torch.distributed as dist

from fourcard_helpers import detect, report, exit_without_teardown
from fourcard_helpers.moe import MoE, expert_parallel

D, E, TOKENS, REPEATS, TILT = 64, 8, 4096, 4, 1.5   # width, experts, tokens per rank, timed steps, router bias
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
sync = torch.cuda.synchronize if cards.kind == "cuda" else lambda: None   # a GPU runs ahead of Python: wait for it
x_all = torch.randn(world * TOKENS, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
x = x_all[rank * TOKENS:(rank + 1) * TOKENS].to(device).requires_grad_()
runs = {}
for routing, tilt in (("as initialised", 0.0), ("skewed", TILT)):
    torch.manual_seed(0)
    moe = MoE(D, E).to(device, torch.float64)
    with torch.no_grad():
        moe.router.bias[0] += tilt                  # every token's score for expert 0 raised by the tilt
    step, compute = [], []
    for repeat in range(REPEATS + 1):               # the first is a warm-up, not kept
        dist.barrier()                              # all ranks start the step together
        start = time.perf_counter()
        out, received = expert_parallel(moe, x)
        out.sum().backward()
        sync()
        step.append(time.perf_counter() - start)
        rows = received.view(world, -1).sum(0).tolist()       # rows for each of my experts, from all ranks
        start = time.perf_counter()                 # the same expert work alone: no routing, no all-to-all
        for j, n in enumerate(rows):
            alone = torch.randn(n, D, dtype=torch.float64, device=device, requires_grad=True)
            moe.experts[rank * len(rows) + j](alone).sum().backward()
        sync()
        compute.append(time.perf_counter() - start)
    runs[routing] = {"received": received, "step": step[1:], "compute": compute[1:]}
seconds = {}                                        # the cost model's points, then what it is asked to predict
for what, numbers in [("all-reduce", 2**k // 8) for k in (14, 16, 18, 20, 22)] + [("all-to-all", TOKENS * D)]:
    buffer, times = torch.ones(numbers, dtype=torch.float64, device=device), []
    for repeat in range(REPEATS + 1):               # the first is a warm-up, not kept
        dist.barrier()
        start = time.perf_counter()
        if what == "all-reduce":
            dist.all_reduce(buffer)
        else:                                       # even splits: a quarter of my rows to each rank, mine included
            dist.all_to_all_single(torch.empty_like(buffer), buffer)
        sync()
        times.append(time.perf_counter() - start)
    seconds[f"{what} {buffer.nbytes}"] = times[1:]
report(**runs, seconds=seconds, setting=[TOKENS, TILT])
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
