import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from fourcard_helpers import detect, load_mnist, report, exit_without_teardown
from fourcard_helpers.models import MnistCNN

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)  # timed steps per setting, after 2 untimed ones
STEPS = parser.parse_args().steps
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
images, labels = load_mnist("train").tensors


def median_seconds(work, repeats):
    """Median time of `repeats` calls of work(i): robust to a busy moment of a shared machine."""
    times = []
    for i in range(repeats):
        if cards.kind == "cuda":
            torch.cuda.synchronize(device)  # GPU work is asynchronous: wait for it before reading a clock
        started = time.perf_counter()
        work(i)
        if cards.kind == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


results = []
for n in (1, 2, 4):
    group = dist.new_group(list(range(n)))  # the first n cards; every rank must call new_group
    # strong: the global batch stays 64, each card gets 64/n; weak: each card keeps 16
    for kind, per_card in (("strong", 64 // n), ("weak", 16)):
        if rank < n:
            torch.manual_seed(0)
            model = DDP(MnistCNN().to(device), device_ids=[device] if cards.kind == "cuda" else None,
                        process_group=group)
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

            def step(i):
                first = (i * n + rank) * per_card  # consecutive slices: card r, step i
                x, y = images[first:first + per_card].to(device), labels[first:first + per_card].to(device)
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad()
            median_seconds(step, 2)  # untimed: the first steps pay for allocation and DDP's set-up
            step_seconds = median_seconds(step, STEPS)
            grads = torch.zeros(sum(p.numel() for p in model.parameters()), device=device)
            allreduce_seconds = median_seconds(lambda i: dist.all_reduce(grads, group=group), STEPS)
            if rank == 0:
                results.append(dict(cards=n, kind=kind, per_card=per_card, step_seconds=step_seconds,
                                    samples_per_s=n * per_card / step_seconds, allreduce_seconds=allreduce_seconds))
                print(f"{n} card(s), {kind:6}: {n * per_card / step_seconds:6.0f} samples/s", flush=True)
        dist.barrier()  # cards outside the group wait
if rank == 0:
    report(scaling=results)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
