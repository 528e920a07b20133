"""Uneven inputs: rank r has 3 + r batches. Join lets the ranks that finish early shadow the others' all-reduces."""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from fourcard_helpers import detect, load_mnist, report, exit_without_teardown
from fourcard_helpers.models import MnistCNN

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
images, labels = (t[:256].to(device) for t in load_mnist("train").tensors)
my_batches = [slice(16 * (4 * k + rank), 16 * (4 * k + rank) + 16) for k in range(3 + rank)]

torch.manual_seed(0)
model = DDP(MnistCNN().to(device), device_ids=[device] if cards.kind == "cuda" else None)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
with Join([model]):  # a rank out of batches answers the others' all-reduces with zeros until all are done
    for part in my_batches:
        optimizer.zero_grad()
        F.cross_entropy(model(images[part]), labels[part]).backward()
        optimizer.step()
print(f"Join: my {len(my_batches)} batches done", flush=True)
report(join_steps=len(my_batches), fc2_bias=model.module.fc2.bias)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
