"""Train the course's case study (MnistCNN on the MNIST subset) on four cards with DDP.

From a terminal, in the notebooks/ folder:   torchrun --nproc-per-node=4 scripts/ddp_mnist.py
"""
import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm

from fourcard_helpers import detect, load_mnist, report
from fourcard_helpers.models import MnistCNN

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=16, help="per card: the global batch is this × the number of cards")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--max-steps", type=int, default=0, help="stop each epoch after this many steps (0: no limit)")
parser.add_argument("--report-weights", action="store_true", help="also report the final weights (for the notebook's check)")
parser.add_argument("--checkpoint", default=str(Path(tempfile.gettempdir()) / "fourcards" / "ddp_mnist.pt"))
args = parser.parse_args()

# 1. Join the process group. torchrun started one process per card and set RANK,
#    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT for each of them.
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
local_rank = int(os.environ["LOCAL_RANK"])
device = cards.device(local_rank)
if cards.kind == "cuda":
    torch.cuda.set_device(device)  # otherwise every rank's NCCL work lands on cuda:0
    torch.backends.cudnn.allow_tf32 = False  # full float32, so that the notebook can compare with one CPU

# 2. Data: the DistributedSampler hands rank r every world-th index of one shared shuffle.
train_set, test_set = load_mnist("train"), load_mnist("test")
sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=0)
loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
# For evaluation, no padding: rank r scores test digits r, r+world, ... (shards may differ by one).
test_loader = DataLoader(Subset(test_set, range(rank, len(test_set), world)), batch_size=250)

# 3. The model: same seed on every rank; DDP also broadcasts rank 0's weights at wrap time.
torch.manual_seed(0)
model = DDP(MnistCNN().to(device), device_ids=[local_rank] if cards.kind == "cuda" else None)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)


def evaluate() -> tuple[int, int]:
    """(correct, total) over the whole test set: each rank counts its shard, one all-reduce adds them."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.int64, device=device)
    with torch.no_grad():
        for images, labels in test_loader:
            predictions = model.module(images.to(device)).argmax(1)  # .module: a plain forward, no DDP hooks
            counts += torch.stack([(predictions == labels.to(device)).sum(), torch.tensor(len(labels), device=device)])
    dist.all_reduce(counts)  # sum over ranks
    return int(counts[0]), int(counts[1])


def save_checkpoint(path: Path, epoch: int) -> None:
    """Rank 0 writes, atomically (write a temporary file, then rename); the others wait."""
    if rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, partial)
        os.replace(partial, path)  # a reader never sees half a file
    dist.barrier()  # nobody reads the file before rank 0 has finished writing it


# 4. The loop.
checkpoint = Path(args.checkpoint)
step_seconds, history = [], []
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)  # a new shuffle every epoch (the same one on every rank)
    model.train()
    loss_sum = torch.zeros(2, device=device)  # (sum of losses, number of steps)
    bar = tqdm(loader, desc=f"epoch {epoch}", disable=rank != 0, mininterval=1)  # one bar, on rank 0
    for step, (images, labels) in enumerate(bar):
        if args.max_steps and step == args.max_steps:
            break
        started = time.perf_counter()
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()  # DDP all-reduces (averages) the gradients during backward
        optimizer.step()
        if cards.kind == "cuda":
            torch.cuda.synchronize()
        step_seconds.append(time.perf_counter() - started)
        loss_sum += torch.stack([loss.detach(), torch.tensor(1.0, device=device)])
    local_loss = (loss_sum[0] / loss_sum[1]).item()
    dist.all_reduce(loss_sum)  # metrics of all ranks, not rank 0's quarter of the data
    correct, total = evaluate()
    print(f"epoch {epoch}: {int(loss_sum[1].item()) // world} steps, my loss {local_loss:.4f}, "
          f"mean loss over ranks {loss_sum[0].item() / loss_sum[1].item():.4f}, test accuracy {correct}/{total}", flush=True)
    history.append({"epoch": epoch, "loss": loss_sum[0].item() / loss_sum[1].item(), "correct": correct, "total": total})
    save_checkpoint(checkpoint, epoch)

# 5. Every rank loads the checkpoint rank 0 wrote, onto its own device, tensors only.
state = torch.load(checkpoint, map_location=device, weights_only=True)
fresh = MnistCNN().to(device)
fresh.load_state_dict(state["model"])  # plain keys ("conv1.weight"), thanks to model.module
same = all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.module.state_dict().values()))

report(history=history, weights=model.module.state_dict() if args.report_weights else None, checkpoint_keys=list(state["model"]), ddp_key=next(iter(model.state_dict())),
       checkpoint_epoch=state["epoch"], checkpoint_matches=same,
       step_seconds=statistics.median(step_seconds[3:] or step_seconds), steps=len(step_seconds))

# 6. Teardown.
dist.destroy_process_group()
