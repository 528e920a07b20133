"""Exercise 3: 1² + 2² + … + 100², shared among the ranks, then all-reduced."""
import os

import torch
import torch.distributed as dist

from fourcard_helpers import detect, report, exit_without_teardown

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)

# your code here: this rank's sum of squares over range(rank + 1, 101, world), as a float64 tensor on device;
# then all_reduce it and report(partial=..., total=...)
raise NotImplementedError

dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
