"""A parameter that takes no part in the loss: DDP's error at the next step, and find_unused_parameters=True."""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from fourcard_helpers import detect, load_mnist, report, exit_without_teardown
from fourcard_helpers.models import MnistCNN

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
images, labels = (t[16 * rank:16 * (rank + 1)].to(device) for t in load_mnist("train").tensors)


class WithSpareHead(MnistCNN):
    def __init__(self):
        super().__init__()
        self.spare_head = nn.Linear(50, 10)  # e.g. an auxiliary head, used only in some runs: not in this forward


def two_steps(**ddp_options):
    """Two forward-backward steps; returns the step at which DDP raised, with its message, or (None, None)."""
    torch.manual_seed(0)
    net = DDP(WithSpareHead().to(device), device_ids=[device] if cards.kind == "cuda" else None, **ddp_options)
    for step in range(2):
        try:
            F.cross_entropy(net(images), labels).backward()
        except RuntimeError as error:
            print(f"step {step}: RuntimeError: {str(error).splitlines()[0][:90]}...", flush=True)
            return step, str(error)
    return None, None


unused_step, unused_error = two_steps()
fixed_step, fixed_error = two_steps(find_unused_parameters=True)  # the fix, at a price on every step
report(unused_step=unused_step, unused_error=unused_error, fixed_error=fixed_error)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
