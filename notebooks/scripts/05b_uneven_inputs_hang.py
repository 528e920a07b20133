"""Staged failure: the uneven-inputs loop without Join. A monitored barrier names the ranks that never arrive."""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from fourcard_helpers import detect, load_mnist, exit_without_teardown
from fourcard_helpers.models import MnistCNN

cards = detect(int(os.environ["WORLD_SIZE"]))
# A process-group timeout of 2 minutes instead of the default (30 min on gloo, 10 on NCCL): a backstop that
# ends every rank's wait even if nothing else does. Here the monitored barrier below ends the run first.
dist.init_process_group(cards.backend, timeout=datetime.timedelta(minutes=2))
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
watch = dist.new_group(backend="gloo")  # a gloo side group for monitored_barrier (which works beside NCCL too)
images, labels = (t[:256].to(device) for t in load_mnist("train").tensors)
my_batches = [slice(16 * (4 * k + rank), 16 * (4 * k + rank) + 16) for k in range(3 + rank)]

torch.manual_seed(0)
model = DDP(MnistCNN().to(device), device_ids=[device] if cards.kind == "cuda" else None)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for part in my_batches:  # the same loop as before, without Join
    optimizer.zero_grad()
    F.cross_entropy(model(images[part]), labels[part]).backward()
    optimizer.step()
print(f"my {len(my_batches)} batches are done; waiting for the others", flush=True)
dist.monitored_barrier(group=watch, timeout=datetime.timedelta(seconds=2), wait_all_ranks=True)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
