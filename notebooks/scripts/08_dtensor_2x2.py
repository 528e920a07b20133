"""Four cards as a 2 × 2 grid: tensor parallel within each row, data parallel across the rows."""
import copy
import gc
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from fourcard_helpers import detect, report, exit_without_teardown

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)

class MLP(nn.Module):
    def __init__(self, d=32, hidden=128):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)
    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

torch.manual_seed(0)  # the dense MLP and input of the by-hand launch (on the CPU, as the notebook)
dense32, x32 = MLP(), torch.randn(16, 32)
probe = torch.linspace(-1, 1, 16 * 32).view(16, 32)   # the by-hand probe: the loss is mean(output · probe)
grid = init_device_mesh(cards.kind, (2, 2), mesh_dim_names=("dp", "tp"))
dp_group = grid["dp"].get_group()
groups = {"dp": dist.get_process_group_ranks(dp_group), "tp": dist.get_process_group_ranks(grid["tp"].get_group())}
half = grid["dp"].get_local_rank()                 # each tensor-parallel pair takes half of the batch
gaps = {}
for dtype in (torch.float64, torch.float32):      # the same numbers twice: float64 holds every float32 exactly
    dense, x, pr = copy.deepcopy(dense32).to(device, dtype), x32.to(device, dtype), probe.to(device, dtype)
    tp2 = parallelize_module(copy.deepcopy(dense), grid["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    (tp2(x.chunk(2)[half]) * pr.chunk(2)[half]).mean().backward()
    dp_bytes = 0
    for p in tp2.parameters():                     # data parallel: average each gradient shard with its twin
        g = p.grad.to_local()
        dp_bytes += g.nbytes
        dist.all_reduce(g, group=dp_group)
        g /= 2
    (dense(x) * pr).mean().backward()              # the reference: whole batch, one dense model
    dense_grads = dict(dense.named_parameters())
    gaps[str(dtype)[6:]] = max((p.grad.full_tensor() - dense_grads[name].grad).abs().max().item()
                               for name, p in tp2.named_parameters())
report(groups=groups, dp_bytes=dp_bytes, gaps=gaps)
del tp2, p, grid, dp_group  # all that holds the mesh's groups, so that they are freed
gc.collect()  # in destroy_process_group() below, while Python runs: freed at interpreter exit, they can abort a rank
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
