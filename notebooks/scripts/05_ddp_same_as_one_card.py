"""The recipe shrunk to two epochs of 256 digits, in float64 and in float32: what DDP computed, for the notebook to compare with one card."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset

from fourcard_helpers import detect, load_mnist, report, exit_without_teardown
from fourcard_helpers.models import MnistCNN

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--digits", type=int, default=256, help="the first N training digits: N/64 steps per epoch")
args = parser.parse_args()

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
    torch.backends.cudnn.allow_tf32 = False  # full float32, as in the recipe
train_set = Subset(load_mnist("train"), range(args.digits))
sampler = DistributedSampler(train_set, shuffle=True, seed=0)
loader = DataLoader(train_set, batch_size=16, sampler=sampler)
runs = {}
for dtype in (torch.float64, torch.float32):
    torch.manual_seed(0)  # the recipe's initial weights, in this precision
    model = DDP(MnistCNN().to(device, dtype), device_ids=[device] if cards.kind == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    first_gradients = None
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for images, labels in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(images.to(device, dtype)), labels.to(device)).backward()
            if first_gradients is None:  # step 1 starts from the same weights everywhere: only its own sums differ
                first_gradients = [param.grad.clone() for param in model.module.parameters()]
            optimizer.step()
    runs[str(dtype).removeprefix("torch.")] = {"weights": model.module.state_dict(), "first_gradients": first_gradients}
report(**runs, digits=len(train_set), steps=2 * len(loader))  # float64 and float32 numbers travel exactly
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
