import os

import torch
import torch.distributed as dist

from fourcard_helpers import detect, report, exit_without_teardown

cards = detect(int(os.environ["WORLD_SIZE"]))  # the notebook's choice, passed to every rank
dist.init_process_group(cards.backend)          # join the others: the rendezvous
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)

mine = torch.tensor([rank + 1.0], device=device)
print(f"hello from rank {rank} of {world}: I contribute {mine.item():.0f}")
dist.all_reduce(mine)                           # sum over all ranks, result on every rank
print(f"rank {rank} now holds {mine.item():.0f}")

report(rank=rank, total=mine.item(), pid=os.getpid())
dist.destroy_process_group()                    # leave the group cleanly
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
