"""FSDP2 with a MixedPrecisionPolicy: gather and compute in bf16, keep fp32 shards, reduce gradients in fp32."""
import gc
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

from fourcard_helpers import detect, report, exit_without_teardown
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
mesh = init_device_mesh(cards.kind, (world,))

calls = []                                             # (collective, dtype, bytes of the whole tensor), per call
class CountedAllGather(DefaultAllGather):              # as in the float32 launch, with the dtype
    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        calls.append(("all_gather", str(output_tensor.dtype), output_tensor.nbytes))
        return super().__call__(output_tensor, input_tensor, group, async_op)
class CountedReduceScatter(DefaultReduceScatter):
    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        calls.append(("reduce_scatter", str(input_tensor.dtype), input_tensor.nbytes))
        return super().__call__(output_tensor, input_tensor, group, op, async_op)

policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
torch.manual_seed(0)                                   # the same MLP, from the same seed
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 16)).to(device)
for layer in model:
    if isinstance(layer, nn.Linear):                   # one FSDP unit per layer, each with the policy
        fully_shard(layer, mesh=mesh, mp_policy=policy)
        layer.set_custom_all_gather(CountedAllGather())
        layer.set_custom_reduce_scatter(CountedReduceScatter())
fully_shard(model, mesh=mesh, mp_policy=policy)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
data = torch.Generator().manual_seed(0)                # the same global batches on every rank
for step in range(2):
    x, y = torch.randn(32, 64, generator=data).to(device), torch.randn(32, 16, generator=data).to(device)
    calls.clear()                                      # keep the last step's collectives
    optimizer.zero_grad()
    out = model(x[rank * 8:rank * 8 + 8])              # bf16 weights, bf16 arithmetic
    nn.functional.mse_loss(out.float(), y[rank * 8:rank * 8 + 8]).backward()
    optimizer.step()
shards = list(model.parameters())                      # DTensors: .to_local() is this rank's piece
state = [s[k].to_local() for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")]
held = sum(p.to_local().nbytes + p.grad.to_local().nbytes for p in shards) + sum(t.nbytes for t in state)
report(output=str(out.dtype), params=sorted({str(p.dtype) for p in shards}), grads=sorted({str(p.grad.dtype) for p in shards}),
       held=held, calls=calls)
del model, layer, optimizer, shards, state, mesh, out  # all that holds the process group, so that it is freed
gc.collect()  # in destroy_process_group() below, while Python runs: freed at interpreter exit, it can abort a rank
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
