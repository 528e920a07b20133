"""A stuck job: rank 3 never reaches the barrier, and monitored_barrier names it."""
import os
import time
from datetime import timedelta

import torch.distributed as dist

from fourcard_helpers import detect

cards = detect(int(os.environ["LOCAL_WORLD_SIZE"]))
# Every collective of this group, and forming the group itself, gives up after 20 s, not 30 minutes (gloo's default).
dist.init_process_group(cards.backend, timeout=timedelta(seconds=20))
rank = dist.get_rank()
checkpoints = dist.new_group(backend="gloo")  # monitored_barrier exists in gloo only; on GPUs too, a gloo group
print(f"rank {rank}: reached the barrier" if rank != 3 else "rank 3: stuck (a dead disk, a deadlock, ...)", flush=True)
if rank == 3:
    time.sleep(60)
dist.monitored_barrier(group=checkpoints, timeout=timedelta(seconds=5))  # rank 0 waits up to 5 s for the others
dist.destroy_process_group()
