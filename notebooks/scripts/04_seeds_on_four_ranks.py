"""What a seed does on four ranks: what DDP makes equal by itself, and what only the seed decides."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from fourcard_helpers import detect, report, exit_without_teardown
from fourcard_helpers.data import load_mnist_raw
from fourcard_helpers.loaders import RandomShiftDataset
from fourcard_helpers.models import MnistCNN

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)

# 1. Random numbers drawn from torch's global generator, seeded alike on every rank or per rank.
seed, drawn = 0, {}
for seeding in ("same seed on every rank", "seed + rank"):
    torch.manual_seed(seed if seeding == "same seed on every rank" else seed + rank)
    model = MnistCNN().to(device)
    before = model.fc2.bias.detach().clone()  # initial weights, drawn before wrapping
    projection = torch.randn(4)  # random, but neither a parameter nor a buffer
    model = DDP(model, device_ids=[device] if cards.kind == "cuda" else None)  # broadcasts rank 0's weights
    drawn[seeding] = {"weights before DDP()": before, "weights after DDP()": model.module.fc2.bias,
                      "other random tensor": projection,
                      "torch.randperm shuffle": torch.randperm(10),  # e.g. a hand-made split of the data
                      "dropout mask": torch.nn.functional.dropout(torch.ones(8, device=device), p=0.5)}

# 2. Random augmentation in two loader workers per rank: 64 digits, 16 per card, batches of 8.
images, labels = load_mnist_raw("train")
data = RandomShiftDataset(images[:64].float().div(255).unsqueeze(1), labels[:64], rng="torch")


def shifts(generator=None):
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, seed=0), num_workers=2,
                        generator=generator)
    return torch.cat([shift for _, _, shift in loader]).tolist()


torch.manual_seed(seed)  # alike on every rank, so the loader's base seed (drawn from it) is alike too
augmentation = {"same seed on every rank": shifts(),
                "seed + rank": shifts(torch.Generator().manual_seed(seed + rank))}  # a loader generator per rank
report(drawn=drawn, augmentation=augmentation)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
