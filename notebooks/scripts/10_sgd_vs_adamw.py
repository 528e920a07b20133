"""SGD with momentum vs AdamW on the case study on four cards: learning rates, batch sizes, warm-up."""
import argparse
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from fourcard_helpers import detect, load_mnist, report, exit_without_teardown
from fourcard_helpers.models import MnistCNN

RUNS = "sgd:0.005:16:0,sgd:0.05:16:0,sgd:0.5:16:0,adamw:0.0001:16:0,adamw:0.001:16:0,adamw:0.01:16:0"
parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--runs", default=RUNS, help="optimizer:lr:batch per card:warm-up steps, comma-separated")
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--seed", type=int, default=0, help="the first weights and the order of the data")
parser.add_argument("--checkpoint", default=str(Path(tempfile.gettempdir()) / "fourcards_10_best.pt"))
args = parser.parse_args()
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
train_set, (test_images, test_labels) = load_mnist("train"), (t.to(device) for t in load_mnist("test")[:])


def train(kind: str, lr: float, batch: int, warmup: int) -> tuple[DDP, list[float], float]:
    torch.manual_seed(args.seed)  # the same first weights for every run
    model = DDP(MnistCNN().to(device), device_ids=[device] if cards.kind == "cuda" else None)
    optimizer = (torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9) if kind == "sgd"
                 else torch.optim.AdamW(model.parameters(), lr=lr))
    ramp = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / (warmup + 1)))  # linear warm-up
    sampler, losses = DistributedSampler(train_set, world, rank, seed=args.seed), []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for images, labels in DataLoader(train_set, batch_size=batch, sampler=sampler):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            ramp.step()
            losses.append(loss.item())  # this rank's quarter of the batch; the notebook averages the ranks
    with torch.no_grad():  # every rank holds the same model, so each can score the whole test set
        accuracy = (model.module(test_images).argmax(1) == test_labels).float().mean().item()
    return model, losses, accuracy


results = []
for run in args.runs.split(","):
    kind, lr, batch, warmup = run.split(":")
    model, losses, accuracy = train(kind, float(lr), int(batch), int(warmup))
    results.append(dict(optimizer=kind, lr=float(lr), batch=int(batch), warmup=int(warmup), accuracy=accuracy, loss=losses))
    if rank == 0 and accuracy >= max(r["accuracy"] for r in results):  # keep the best model for later
        torch.save(model.module.state_dict(), args.checkpoint)
report(results=results)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
