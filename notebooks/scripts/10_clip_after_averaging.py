"""Gradient clipping under DDP: clip after backward, once the gradients are averaged over the ranks."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from fourcard_helpers import detect, load_mnist, report, exit_without_teardown
from fourcard_helpers.models import MnistCNN

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--max-norm", type=float, default=0.1)
args = parser.parse_args()

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
torch.manual_seed(0)
model = DDP(MnistCNN().to(device), device_ids=[device] if cards.kind == "cuda" else None)
images, labels = (t.to(device) for t in load_mnist("train")[rank * 16:(rank + 1) * 16])


def gradient_norm() -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters()]).norm()


with model.no_sync():  # backward without DDP's all-reduce: this rank's own gradient, for comparison
    F.cross_entropy(model(images), labels).backward()
own_norm = gradient_norm()
model.zero_grad()

F.cross_entropy(model(images), labels).backward()  # DDP averages the gradients during backward...
total_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=args.max_norm)  # ...then clip
clipped = torch.cat([p.grad.flatten() for p in model.parameters()])
report(own_norm=own_norm, total_norm=total_norm, clipped_norm=clipped.norm(), clipped=clipped)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
