"""Lesson 13's GPT with FSDP2 on four cards: every block, then the whole model, sharded; every block recomputed in
backward. Float32 against bf16 mixed precision (fp32 shards, bf16 compute, fp32 gradient reduction), and float32 on
other batches (the yardstick). Reports every step's loss and the bytes each rank holds."""
import os, sys, torch, torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from fourcard_helpers import detect, report
from fourcard_helpers.gpt import GPT, Checkpointed, GPTConfig, get_batch, poem_tokens

STEPS, BATCH = 30, 32
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
mesh = init_device_mesh(cards.kind, (world,))
tokens, chars = poem_tokens()
config = GPTConfig(vocab_size=len(chars))
mine = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
POLICY = {"float32": MixedPrecisionPolicy(),                     # the default: compute in the shards' float32
          "bf16 mixed": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}
runs = {}
for run, policy, data_seed in (("float32", "float32", 0), ("bf16 mixed", "bf16 mixed", 0),
                               ("float32, other batches", "float32", 1)):
    torch.manual_seed(0)                                         # the same initial weights in every run
    model = GPT(config).to(device)
    model.layers = nn.ModuleList(Checkpointed(block) for block in model.layers)
    for block in model.layers:                                   # one FSDP unit per block...
        fully_shard(block, mesh=mesh, mp_policy=POLICY[policy])
    fully_shard(model, mesh=mesh, mp_policy=POLICY[policy])      # ...and one for the rest
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.Generator().manual_seed(data_seed)
    losses = []
    for step in range(STEPS):
        x, y = get_batch(tokens, BATCH, config.block_size, data)
        _, loss = model(x[mine].to(device), y[mine].to(device))
        loss.backward()
        held = {"parameters": sum(p.to_local().nbytes for p in model.parameters()),   # this rank's shards
                "gradients": sum(p.grad.to_local().nbytes for p in model.parameters())}
        dtypes = sorted({f"{kind}: {t.dtype}" for p in model.parameters() for kind, t in (("shards", p), ("gradients", p.grad))})
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    held["AdamW state"] = sum(s[k].to_local().nbytes for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq"))
    runs[run] = {"losses": losses, "held": held, "shards": sum(p.to_local().numel() for p in model.parameters()),
                 "dtypes": dtypes}
report(**runs)
dist.destroy_process_group()
sys.stdout.flush(); os._exit(0)  # skip Python's teardown, which can abort a gloo rank (lesson 00)
