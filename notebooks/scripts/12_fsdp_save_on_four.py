"""FSDP2 on four ranks: train three steps, then save the sharded model and optimizer with torch.distributed.checkpoint."""
import argparse
import hashlib
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from fourcard_helpers import detect, load_mnist, report, exit_without_teardown
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
mesh = init_device_mesh(cards.kind, (world,))  # named: FSDP2's default is CUDA in any CUDA build
torch.manual_seed(0)
model = MnistCNN().to(device)
for layer in model.children():
    fully_shard(layer, mesh=mesh)  # each layer's tensors split by rows over the ranks
fully_shard(model, mesh=mesh)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
X, Y = load_mnist("train").tensors
for step in range(3):
    mine = slice((step * world + rank) * 32, (step * world + rank + 1) * 32)
    optimizer.zero_grad()
    F.cross_entropy(model(X[mine].to(device)), Y[mine].to(device)).backward()
    optimizer.step()
if rank == 0:
    shutil.rmtree(args.checkpoint_dir, ignore_errors=True)
dist.barrier()
model_state, optimizer_state = get_state_dict(model, optimizer)  # each rank: its own shards, named
dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=args.checkpoint_dir)
full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))  # gathered: every rank
digest = hashlib.sha256(b"".join(t.cpu().numpy().tobytes() for t in full.values())).hexdigest()
report(rows={name: list(p.to_local().shape) for name, p in model.named_parameters()},
       files=sorted(os.listdir(args.checkpoint_dir)), weights_sha256=digest)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
