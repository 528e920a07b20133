"""The recipe in float64, shrunk to two epochs of 256 digits: DDP's weights, for the notebook to compare with one card."""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset

from fourcard_helpers import detect, load_mnist, report
from fourcard_helpers.models import MnistCNN

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--digits", type=int, default=256, help="the first N training digits: N/64 steps per epoch")
args = parser.parse_args()

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
train_set = Subset(load_mnist("train"), range(args.digits))
sampler = DistributedSampler(train_set, shuffle=True, seed=0)
loader = DataLoader(train_set, batch_size=16, sampler=sampler)
torch.manual_seed(0)  # the recipe's initial weights, then in float64
model = DDP(MnistCNN().to(device, torch.float64), device_ids=[device] if cards.kind == "cuda" else None)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for images, labels in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(images.to(device, torch.float64)), labels.to(device)).backward()
        optimizer.step()
report(weights=model.module.state_dict(), digits=len(train_set), steps=2 * len(loader))  # float64 travels exactly
dist.destroy_process_group()
sys.stdout.flush(); os._exit(0)  # skip Python's teardown, which can abort a gloo rank (lesson 00)
