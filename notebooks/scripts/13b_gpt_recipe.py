"""Lesson 13's GPT trained as nanoGPT's train.py trains, with FSDP2: a validation loss on held-out poems, a warm-up then a
cosine learning rate, the gradient's norm clipped, weight decay on the matrices only. Reports per step the rate, the norm
before and after clipping, the losses; then the weights, or (--save) rank 0 writes the model in bf16."""
import argparse
import math
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from fourcard_helpers import detect, report, exit_without_teardown
from fourcard_helpers.gpt import GPT, GPTConfig, get_batch, poem_tokens

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--warmup", type=int, default=3, help="steps of linear warm-up to the peak learning rate")
parser.add_argument("--batch", type=int, default=16, help="windows per step, all ranks together")
parser.add_argument("--max-norm", type=float, default=0.5, help="the clip (nanoGPT: 1.0, which this short run stays under)")
parser.add_argument("--dtype", default="float64", choices=["float64", "float32"])
parser.add_argument("--validate-every", type=int, default=4, help="steps between two validation losses")
parser.add_argument("--save", help="a folder: rank 0 writes the trained model there, in bf16, instead of reporting it")
args = parser.parse_args()
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
tokens, chars = poem_tokens()
ends = (tokens == chars.index("\n")).nonzero().flatten()         # where each poem ends
split = int(ends[int(0.9 * len(ends)) - 1]) + 1                 # the first 90 % of the poems train; the rest: held out
config, mine = GPTConfig(vocab_size=len(chars)), slice(rank * args.batch // world, (rank + 1) * args.batch // world)
torch.manual_seed(0)
model, mesh = GPT(config).to(device, getattr(torch, args.dtype)), init_device_mesh(cards.kind, (world,))
for block in model.layers:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
decay = {name: p for name, p in model.named_parameters() if p.dim() >= 2}    # nanoGPT's rule: every matrix
optimizer = torch.optim.AdamW([{"params": list(decay.values()), "weight_decay": 0.1},
                               {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}],
                              lr=3e-3, betas=(0.9, 0.95))
def lr_factor(step: int) -> float:                              # × the peak: nanoGPT's get_lr, a warm-up, a cosine to 0.1
    if step < args.warmup:
        return (step + 1) / (args.warmup + 1)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - args.warmup) / (args.steps - 1 - args.warmup)))
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
val_x, val_y = get_batch(tokens[split:], args.batch, config.block_size, torch.Generator().manual_seed(1))   # always these
@torch.no_grad()
def validation_loss() -> float:            # the mean over all ranks' held-out windows (no dropout here: no eval() needed)
    loss = model(val_x[mine].to(device), val_y[mine].to(device))[1].detach().clone()
    dist.all_reduce(loss)
    return loss.item() / world
data, found = torch.Generator().manual_seed(0), {"lr": [], "norm": [], "clipped": [], "train": [], "validation": [(0, validation_loss())]}
for step in range(args.steps):
    x, y = get_batch(tokens[:split], args.batch, config.block_size, data)
    _, loss = model(x[mine].to(device), y[mine].to(device))
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=args.max_norm)   # on DTensors: a DTensor, whole
    clipped = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])      # the norm it left behind
    found["lr"].append(scheduler.get_last_lr()[0])                # the rate this step uses
    found["train"].append(loss.item())
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()
    found["norm"].append(norm.full_tensor().item())
    found["clipped"].append(clipped.full_tensor().item())
    if (step + 1) % args.validate_every == 0:
        found["validation"].append((step + 1, validation_loss()))
model.reshard()                                                 # the root keeps its weights gathered after forward
weights = torch.cat([p.full_tensor().detach().flatten().cpu() for p in model.parameters()])   # every rank gathers
if args.save and rank == 0:                                     # one card's model made of them, in bf16 (tie kept)
    torch.nn.utils.vector_to_parameters(weights, (whole := GPT(config)).parameters())
    os.makedirs(args.save, exist_ok=True)
    torch.save(whole.to(torch.bfloat16).state_dict(), os.path.join(args.save, "model.pt"))
report(**found, decayed=sorted(decay), split=split, groups=[(g["weight_decay"], len(g["params"])) for g in optimizer.param_groups],
       max_norm=args.max_norm, warmup=args.warmup, peak=optimizer.defaults["lr"], weights=weights if rank == 0 and not args.save else None)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
