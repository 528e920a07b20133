"""Load the four-rank FSDP2 checkpoint on two ranks: torch.distributed.checkpoint reshards it."""
import argparse
import hashlib
import os
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from fourcard_helpers import detect, exit_without_teardown, report
from fourcard_helpers.models import MnistCNN

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--checkpoint-dir", default=os.path.join(tempfile.gettempdir(), "fourcards_12_fsdp"))
args = parser.parse_args()
cards = detect(int(os.environ["LOCAL_WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)


def weights_sha256(model):
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return hashlib.sha256(b"".join(t.cpu().numpy().tobytes() for t in full.values())).hexdigest()


torch.manual_seed(1)  # other initial weights than the run that saved: only the load can make them equal
model = MnistCNN().to(device)
# The mesh is named: FSDP2's default is CUDA in any CUDA build of torch, even for simulated cards.
mesh = init_device_mesh(cards.kind, (world,))
for layer in model.children():
    fully_shard(layer, mesh=mesh)  # now split over two ranks, not four
fully_shard(model, mesh=mesh)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
before = weights_sha256(model)
model_state, optimizer_state = get_state_dict(model, optimizer)  # the shapes THIS layout wants
steps_before_load = float(optimizer.state_dict()["state"][0]["step"])  # get_state_dict made Adam's state
state = {"model": model_state, "optimizer": optimizer_state}
dcp.load(state, checkpoint_id=args.checkpoint_dir)  # each rank reads the pieces of its own shards
set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
report(rows={name: list(p.to_local().shape) for name, p in model.named_parameters()},
       before_sha256=before, weights_sha256=weights_sha256(model), adam_steps=float(optimizer.state_dict()["state"][0]["step"]),
       steps_before_load=steps_before_load)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
