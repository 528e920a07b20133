"""What DistributedSampler gives each of four ranks: 22 samples, three epochs, with and without set_epoch."""
import os

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from fourcard_helpers import detect, report, exit_without_teardown

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)

toy = range(22)  # not divisible by 4 cards
shards = {}
for calls_set_epoch in (False, True):
    sampler = DistributedSampler(toy, num_replicas=world, rank=rank, shuffle=True, seed=0)
    epochs = []
    for epoch in range(3):
        if calls_set_epoch:
            sampler.set_epoch(epoch)  # the shuffle's seed is seed + epoch
        epochs.append(list(sampler))
    shards["with set_epoch" if calls_set_epoch else "without set_epoch"] = epochs
dropping = DistributedSampler(toy, shuffle=True, seed=0, drop_last=True)  # rank and world from the process group
report(shards=shards, dropping=list(dropping))
dist.barrier()  # no collective so far: without one, a fast rank could exit while the others still connect
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
