"""Lesson 13's GPT with DDP on four cards: each rank takes its quarter of the same batches of windows. Reports the
first step's gradient and the weights after --steps AdamW steps in each of --dtypes, each rank's loss at every step,
and DDP's buckets in one step under bf16 autocast."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from fourcard_helpers import detect, report, exit_without_teardown
from fourcard_helpers.gpt import GPT, GPTConfig, get_batch, poem_tokens

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--batch", type=int, default=32, help="windows per step, all ranks together")
parser.add_argument("--dtypes", default="float64,float32")
args = parser.parse_args()
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
tokens, chars = poem_tokens()
config = GPTConfig(vocab_size=len(chars))
mine = slice(rank * args.batch // world, (rank + 1) * args.batch // world)   # this rank's quarter of each batch
weights, gradients, losses = {}, {}, []
for dtype in args.dtypes.split(","):
    torch.manual_seed(0)                                      # one card's initial weights, on every rank
    model = DDP(GPT(config).to(device, getattr(torch, dtype)), device_ids=[device] if cards.kind == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.Generator().manual_seed(0)                   # the same batches on every rank, as on one card
    losses = []
    for step in range(args.steps):
        x, y = get_batch(tokens, args.batch, config.block_size, data)
        _, loss = model(x[mine].to(device), y[mine].to(device))
        optimizer.zero_grad()
        loss.backward()                                       # DDP averages the four gradients
        if step == 0:
            gradients[dtype] = torch.cat([p.grad.flatten().cpu() for p in model.module.parameters()])
        optimizer.step()
        losses.append(loss.item())                            # the mean loss of this rank's quarter
    weights[dtype] = torch.cat([p.detach().flatten().cpu() for p in model.module.parameters()])
buckets = []                                                  # one step under bf16 autocast: what DDP sends
def noted(state, bucket):                                     # a comm hook: note each bucket, then DDP's own all-reduce
    buckets.append((str(bucket.buffer().dtype), bucket.buffer().nbytes))
    return allreduce_hook(state, bucket)
mixed = DDP(GPT(config).to(device), device_ids=[device] if cards.kind == "cuda" else None)   # float32 parameters
mixed.register_comm_hook(None, noted)
with torch.autocast(device.type, dtype=torch.bfloat16):
    _, loss = mixed(x[mine].to(device), y[mine].to(device))
loss.backward()
report(weights=weights if rank == 0 else None, gradients=gradients if rank == 0 else None, losses=losses,
       buckets=buckets, autocast_gradients=sorted({str(p.grad.dtype) for p in mixed.parameters()}))
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
