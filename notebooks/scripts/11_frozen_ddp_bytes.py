"""DDP's bytes per step when part of the model is frozen, counted where DDP hands them to the all-reduce."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from fourcard_helpers import detect, load_mnist, report
from fourcard_helpers.models import MnistCNN

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, device = dist.get_rank(), cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
torch.manual_seed(0)
model = MnistCNN().to(device)
for p in [*model.conv1.parameters(), *model.conv2.parameters()]:
    p.requires_grad_(False)                   # fine-tuning: the convolutions stay as they are
ddp = DDP(model, device_ids=[device] if cards.kind == "cuda" else None)
handed = []


def counting_hook(group, bucket):             # DDP's default all-reduce, counting each bucket it is handed
    handed.append(bucket.buffer().numel() * bucket.buffer().element_size())
    return default_hooks.allreduce_hook(group, bucket)


ddp.register_comm_hook(dist.group.WORLD, counting_hook)
images, labels = (t[:64].to(device) for t in load_mnist("train").tensors)
mine = slice(16 * rank, 16 * rank + 16)
per_step = []
for step in range(2):
    handed.clear()
    F.cross_entropy(ddp(images[mine]), labels[mine]).backward()
    per_step.append(sum(handed))
report(bytes_per_step=per_step)
dist.destroy_process_group()
sys.stdout.flush(); os._exit(0)  # skip Python's teardown, which can abort a gloo rank (lesson 00)
