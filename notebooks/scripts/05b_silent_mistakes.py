"""Staged mistakes that raise nothing: no set_epoch, and every rank saving the same checkpoint file."""
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from fourcard_helpers import MnistCNN, detect, load_mnist, report, exit_without_teardown

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
torch.manual_seed(0)
model = DDP(MnistCNN().to(device), device_ids=[device] if cards.kind == "cuda" else None)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
train_set = torch.utils.data.Subset(load_mnist("train"), range(640))  # a small slice: the point is the order
sampler = DistributedSampler(train_set, shuffle=True)
loader = DataLoader(train_set, batch_size=16, sampler=sampler)

first_batches = []
for epoch in range(2):
    # mistake 1: sampler.set_epoch(epoch) is missing here
    for step, (images, labels) in enumerate(loader):
        if step == 0:
            first_batches.append(labels.tolist())
        optimizer.zero_grad()
        F.cross_entropy(model(images.to(device)), labels.to(device)).backward()
        optimizer.step()

# mistake 2: every rank writes the same file (the fix: only rank 0 writes, then a barrier)
path = os.path.join(tempfile.gettempdir(), "fourcard_05b_silent.pt")
torch.save(model.module.state_dict(), path)
dist.barrier()
report(same_first_batch_both_epochs=first_batches[0] == first_batches[1])
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
