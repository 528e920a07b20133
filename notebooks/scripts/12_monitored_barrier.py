"""A stuck job: rank 3 never reaches the barrier, and monitored_barrier names it."""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from fourcard_helpers import detect, exit_without_teardown

cards = detect(int(os.environ["LOCAL_WORLD_SIZE"]))
# A backstop: forming the group and every collective of it give up after 20 s (defaults: gloo 30 min, NCCL 10 min).
dist.init_process_group(cards.backend, timeout=timedelta(seconds=20))
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
gloo_group = dist.new_group(backend="gloo")  # monitored_barrier exists in gloo only; on GPUs too, a gloo group
print(f"rank {rank}: reached the barrier" if rank != 3 else "rank 3: stuck (a dead disk, a deadlock, ...)", flush=True)
if rank == 3:
    time.sleep(60)
try:
    dist.monitored_barrier(group=gloo_group, timeout=timedelta(seconds=5))  # rank 0 waits up to 5 s for the others
except RuntimeError:
    time.sleep(0 if rank == 0 else 10)  # rank 0's error names the missing rank: let it be the one that ends the job
    raise
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
