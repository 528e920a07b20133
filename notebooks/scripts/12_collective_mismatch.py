"""Ranks out of step: rank 3 all-reduces a tensor of another shape. TORCH_DISTRIBUTED_DEBUG=DETAIL says so."""
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from fourcard_helpers import detect, exit_without_teardown

# The same as starting the job as `TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun ...`; must come before the group.
dist.set_debug_level(dist.DebugLevel.DETAIL)
cards = detect(int(os.environ["LOCAL_WORLD_SIZE"]))
dist.init_process_group(cards.backend, timeout=timedelta(seconds=20))
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
dist.all_reduce(torch.ones(4, device=device))  # every rank agrees: fine
last_batch = 3 if rank == 3 else 4  # as when rank 3 holds fewer samples of an unpadded split
dist.all_reduce(torch.ones(last_batch, device=device))  # DETAIL compares every rank's call before running it
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
