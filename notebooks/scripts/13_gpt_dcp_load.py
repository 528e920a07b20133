"""Load the 2 × 2 mesh's checkpoint into FSDP2 over all four ranks (a 1-D mesh): torch.distributed.checkpoint reshards it."""
import os
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from fourcard_helpers import detect, report, exit_without_teardown
from fourcard_helpers.gpt import GPT, GPTConfig, poem_tokens

FOLDER = os.path.join(tempfile.gettempdir(), "fourcards_13_2d")   # where the 2 × 2 mesh saved its model
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
mesh = init_device_mesh(cards.kind, (4,))                      # one dimension: FSDP2 over all four ranks, no tensor parallel
torch.manual_seed(1)                                           # other initial weights: only the load can make them equal
model = GPT(GPTConfig(vocab_size=len(poem_tokens()[1]))).to(device)
for block in model.layers:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
state = get_model_state_dict(model)                            # the shards THIS layout wants: a quarter of each row range
dcp.load(state, checkpoint_id=FOLDER)                          # each rank reads the pieces that overlap its quarter
set_model_state_dict(model, state)
weights = torch.cat([p.full_tensor().detach().cpu().flatten() for p in model.parameters()])   # whole, for one card's view
report(weights=weights if rank == 0 else None,
       rows={name: list(p.to_local().shape) for name, p in model.named_parameters()})
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
