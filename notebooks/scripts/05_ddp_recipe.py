"""Train the case study (MnistCNN) with DDP on every card torchrun starts: lesson 01's training, distributed."""
import argparse
import hashlib
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from fourcard_helpers import detect, load_mnist, report, exit_without_teardown
from fourcard_helpers.models import MnistCNN

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--batch-size", type=int, default=16, help="per card: the global batch is this × the cards")
parser.add_argument("--checkpoint", default=os.path.join(tempfile.gettempdir(), "fourcards_05_mnist.pt"))
args = parser.parse_args()

# 1. The process group: torchrun set RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous address for each process.
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)  # otherwise every rank's NCCL work lands on cuda:0
    torch.backends.cudnn.allow_tf32 = False  # full float32, so that the notebook can compare with one CPU
# 2. The data: rank r gets every world-th index of one shuffle that all ranks share.
train_set = load_mnist("train")
sampler = DistributedSampler(train_set, shuffle=True, seed=0)
loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
# 3. The model: DDP copies rank 0's weights to every rank, then averages the gradients in every backward().
torch.manual_seed(0)  # a repeatable run: rank 0 starts from lesson 01's initial weights
model = DDP(MnistCNN().to(device), device_ids=[device] if cards.kind == "cuda" else None)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)  # lesson 01's settings
# 4. Two epochs, each timed; the loss is averaged over all ranks (rank 0's alone is a quarter of the data).
epoch_seconds, losses = [], []
for epoch in range(2):
    sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
    loss_sum, started = torch.zeros(2, device=device), time.perf_counter()  # (sum of losses, steps)
    for images, labels in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images.to(device)), labels.to(device))
        loss.backward()  # DDP all-reduces the gradients during backward
        optimizer.step()
        loss_sum += torch.stack([loss.detach(), torch.ones((), device=device)])
    dist.all_reduce(loss_sum)  # summed over the ranks: every rank now holds the same totals
    losses.append((loss_sum[0] / loss_sum[1]).item())  # .item() waits for the GPU, if any: then read the clock
    epoch_seconds.append(time.perf_counter() - started)
    print(f"epoch {epoch}: mean training loss over all ranks {losses[-1]:.4f}", flush=True)
# 5. The checkpoint: rank 0 writes the unwrapped model, atomically; the others wait at the barrier.
if rank == 0:
    torch.save({"model": model.module.state_dict(), "epoch": epoch}, args.checkpoint + ".partial")
    os.replace(args.checkpoint + ".partial", args.checkpoint)  # a reader never sees half a file
dist.barrier()
weights = torch.cat([p.detach().flatten() for p in model.module.parameters()]).cpu().numpy().tobytes()
report(losses=losses, weights_sha256=hashlib.sha256(weights).hexdigest(), ddp_key=next(iter(model.state_dict())),
       epoch_seconds=epoch_seconds, steps=len(loader) * 2, samples=len(sampler) * world)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
