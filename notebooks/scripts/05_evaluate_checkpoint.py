"""Load the recipe's checkpoint on every rank, safely, and count test accuracy over four cards: padded or exact."""
import argparse
import os
import tempfile

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, Subset

from fourcard_helpers import detect, load_mnist, report, exit_without_teardown
from fourcard_helpers.models import MnistCNN

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--checkpoint", default=os.path.join(tempfile.gettempdir(), "fourcards_05_mnist.pt"))
args = parser.parse_args()
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)

model = MnistCNN().to(device)
if os.path.isfile(args.checkpoint):  # map_location: onto this rank's device; weights_only: tensors, no code
    state = torch.load(args.checkpoint, map_location=device, weights_only=True)
    model.load_state_dict(state["model"])  # plain keys ("conv1.weight"): rank 0 saved model.module
else:
    print(f"no checkpoint at {args.checkpoint} (run scripts/05_ddp_recipe.py first): untrained weights", flush=True)
model.eval()
eval_set = Subset(load_mnist("test"), range(998))  # 998 digits: not divisible by 4 cards


def count(dataset, sampler=None):
    """(correct, total) on this rank's part of `dataset`, summed over the ranks."""
    counts = torch.zeros(2, dtype=torch.int64, device=device)
    with torch.no_grad():
        for images, labels in DataLoader(dataset, batch_size=250, sampler=sampler):
            right = (model(images.to(device)).argmax(1) == labels.to(device)).sum()
            counts += torch.stack([right, torch.tensor(len(labels), device=device)])
    dist.all_reduce(counts)
    return counts


padded_sampler = DistributedSampler(eval_set, shuffle=False)  # pads to 1,000 so that every rank gets 250
padded = count(eval_set, padded_sampler)
exact = count(Subset(eval_set, range(rank, len(eval_set), world)))  # the fix: unpadded shards
print(f"I scored {len(padded_sampler)} digits with the padded sampler; totals: padded {padded.tolist()}, "
      f"exact {exact.tolist()}", flush=True)
report(padded=padded, exact=exact, my_padded_indices=list(padded_sampler))
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
