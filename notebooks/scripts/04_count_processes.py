"""How many processes a four-card job with two loader workers per card really runs."""
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from fourcard_helpers import detect, report, exit_without_teardown
from fourcard_helpers.loaders import SyntheticCostDataset

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)


def children(pid):
    """Process ids whose parent is `pid`, read from /proc (Linux)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if parent == pid:
                found.append(int(entry))
    return sorted(found)


data = SyntheticCostDataset(64)
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, seed=0), num_workers=2)
batches = iter(loader)
next(batches)  # this rank's two workers are running now
dist.barrier()  # ...and every other rank's
tree = None
if rank == 0:  # from torchrun's agent, the parent of every rank: its ranks, and their children
    tree = {pid: children(pid) for pid in children(os.getppid())}
dist.barrier()  # no rank stops its workers before rank 0 has counted them
report(pid=os.getpid(), agent=os.getppid(), workers=children(os.getpid()), tree=tree, steps=len(loader))
del batches  # stops this rank's workers
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
