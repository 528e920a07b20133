"""Lesson 13's GPT with FSDP2 on four cards, every block then the whole model sharded, every block recomputed in backward:
float32 against bf16 mixed precision (fp32 shards, bf16 compute, fp32 gradient reduction) and against float32 on other
batches (the yardstick), 8 steps of 16 windows; section 3's first step in float32 and its 4 steps in float64, to compare
with one card; one step reducing in bf16. Reports losses, fixed-batch losses, held bytes and dtypes, weights, gradients."""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from fourcard_helpers import detect, report, exit_without_teardown
from fourcard_helpers.gpt import GPT, Checkpointed, GPTConfig, get_batch, poem_tokens

BATCH, SMALL = 32, 16                     # section 3's batch; the 8-step runs' batch
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
mesh = init_device_mesh(cards.kind, (world,))
tokens, chars = poem_tokens()
config = GPTConfig(vocab_size=len(chars))
quarter = slice(rank * SMALL // world, (rank + 1) * SMALL // world)   # this rank's part of the fixed batch
fixed_x, fixed_y = get_batch(tokens, SMALL, config.block_size, torch.Generator().manual_seed(99))   # the same for every run
MIXED = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
AS_IS, REDUCE_BF16 = MixedPrecisionPolicy(), MixedPrecisionPolicy(torch.bfloat16, torch.bfloat16)   # AS_IS: no cast
runs = {}
for run, policy, dtype, data_seed, steps, batch in (("float32", AS_IS, torch.float32, 0, 8, SMALL),
                                                    ("bf16 mixed", MIXED, torch.float32, 0, 8, SMALL),
                                                    ("float32, other batches", AS_IS, torch.float32, 1, 8, SMALL),
                                                    ("bf16 reduce", REDUCE_BF16, torch.float32, 0, 1, SMALL),
                                                    ("float32, one step", AS_IS, torch.float32, 0, 1, BATCH),
                                                    ("float64", AS_IS, torch.float64, 0, 4, BATCH)):
    mine = slice(rank * batch // world, (rank + 1) * batch // world)
    torch.manual_seed(0)                                         # the same initial weights in every run
    model = GPT(config).to(device, dtype)
    model.layers = nn.ModuleList(Checkpointed(block) for block in model.layers)
    for block in model.layers:                                   # one FSDP unit per block...
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)              # ...and one for the rest
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data, losses, fixed = torch.Generator().manual_seed(data_seed), [], []
    for step in range(steps):
        x, y = get_batch(tokens, batch, config.block_size, data)
        _, loss = model(x[mine].to(device), y[mine].to(device))
        loss.backward()
        if step == 0 and run in ("float32, one step", "float64"):   # the first step's gradient, whole (every rank)
            first = torch.cat([p.grad.full_tensor().flatten().cpu() for p in model.parameters()])
        held = {"parameters": sum(p.to_local().nbytes for p in model.parameters()),   # this rank's shards
                "gradients": sum(p.grad.to_local().nbytes for p in model.parameters())}
        dtypes = sorted({f"{kind}: {t.dtype}" for p in model.parameters() for kind, t in (("shards", p), ("gradients", p.grad))})
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        with torch.no_grad():                                    # the same windows for every run, loss in float32
            logits, _ = model(fixed_x[quarter].to(device))
            fixed.append(F.cross_entropy(logits.float().flatten(0, 1), fixed_y[quarter].flatten().to(device)).item())
        model.reshard()                                          # the root keeps its gathered weights after forward
    held["AdamW state"] = sum(s[k].to_local().nbytes for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq"))
    weights = torch.cat([p.full_tensor().detach().flatten().cpu() for p in model.parameters()])   # every rank gathers
    runs[run] = {"losses": losses, "fixed": fixed, "held": held, "dtypes": dtypes,
                 "shards": sum(p.to_local().numel() for p in model.parameters()),
                 "weights": weights if run == "float64" and rank == 0 else None,
                 "gradient": first if run in ("float32, one step", "float64") and rank == 0 else None}
report(**runs)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
