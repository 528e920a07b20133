import gc
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter
from torch.nn.parallel import DistributedDataParallel as DDP

from fourcard_helpers import detect, report, exit_without_teardown
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
mesh = init_device_mesh(cards.kind, (world,))          # the four cards as a one-dimensional mesh
DTYPE = torch.float64 if "--float64" in sys.argv else torch.float32   # --float64: the same run, rounded far finer
calls = []                                             # (collective, bytes of the whole tensor), per call
class CountedAllGather(DefaultAllGather):              # FSDP2's own collectives, counted on the way
    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        calls.append(("all_gather", output_tensor.nbytes))
        return super().__call__(output_tensor, input_tensor, group, async_op)
class CountedReduceScatter(DefaultReduceScatter):
    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        calls.append(("reduce_scatter", input_tensor.nbytes))
        return super().__call__(output_tensor, input_tensor, group, op, async_op)
def counted_all_reduce(state, bucket):                 # a DDP communication hook: count, then all-reduce
    calls.append(("all_reduce", bucket.buffer().nbytes))
    return allreduce_hook(None, bucket)
def make():                                            # the same model from the same seed, each time
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 16)).to(device, DTYPE)
models = {"one card": make(), "DDP": DDP(make()), "FSDP2": make()}
models["DDP"].register_comm_hook(None, counted_all_reduce)
for layer in models["FSDP2"]:
    if isinstance(layer, nn.Linear):                   # one FSDP unit per layer
        fully_shard(layer, mesh=mesh)
        layer.set_custom_all_gather(CountedAllGather())
        layer.set_custom_reduce_scatter(CountedReduceScatter())
fully_shard(models["FSDP2"], mesh=mesh)
optimizers = {name: torch.optim.Adam(model.parameters(), lr=1e-2) for name, model in models.items()}
def gap(name, grads=False):                            # largest difference to one card's weights (or gradients)
    ours, one = ([p.grad if grads else p for p in models[k].parameters()] for k in (name, "one card"))
    return max(((a.full_tensor() if name == "FSDP2" else a) - b).abs().max().item() for a, b in zip(ours, one))
data, sent = torch.Generator().manual_seed(0), {}       # the same global batches on every rank
for step in range(3):
    x, y = torch.randn(32, 64, generator=data).to(device, DTYPE), torch.randn(32, 16, generator=data).to(device, DTYPE)
    for name, model in models.items():
        calls.clear()
        optimizers[name].zero_grad()
        xs, ys = (x, y) if name == "one card" else (x[rank * 8:rank * 8 + 8], y[rank * 8:rank * 8 + 8])  # a quarter
        nn.functional.mse_loss(model(xs), ys).backward()
        optimizers[name].step()
        sent[name] = list(calls)                       # the last step's collectives
    if step == 0:                                      # all started from the same weights: judged in float32 here
        first = {"fsdp": gap("FSDP2", grads=True), "ddp": gap("DDP", grads=True)}
shards = list(models["FSDP2"].parameters())            # DTensors: .to_local() is this rank's piece
held = {"weights": sum(p.to_local().nbytes for p in shards), "gradients": sum(p.grad.to_local().nbytes for p in shards),
        "Adam m, v": sum(s[k].to_local().nbytes for s in optimizers["FSDP2"].state.values() for k in ("exp_avg", "exp_avg_sq"))}
report(P=sum(p.numel() for p in models["one card"].parameters()), bytes=held, sent=sent, kind=type(shards[0]).__name__,
       placement=str(shards[0].placements), gap_fsdp=gap("FSDP2"), gap_ddp=gap("DDP"), first=first)
del models, model, layer, optimizers, shards, mesh  # all that holds the process group, so that it is freed
gc.collect()  # in destroy_process_group() below, while Python runs: freed at interpreter exit, it can abort a rank
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
