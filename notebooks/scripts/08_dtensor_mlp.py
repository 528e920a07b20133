"""The same Megatron MLP with DTensor: parallelize_module with ColwiseParallel and RowwiseParallel."""
import copy
import gc
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
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
mesh = init_device_mesh(cards.kind, (world,), mesh_dim_names=("tp",))   # four cards in a row
probe = lambda t: torch.linspace(-1, 1, t.numel(), dtype=t.dtype, device=device).view_as(t)   # as by hand
gaps = {}
for dtype in (torch.float64, torch.float32):     # the same numbers twice: float64 holds every float32 exactly
    dense, x = copy.deepcopy(dense32).to(device, dtype), x32.to(device, dtype)
    tp = parallelize_module(copy.deepcopy(dense), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    xt, xd = x.clone().requires_grad_(), x.clone().requires_grad_()
    counting = CommDebugMode()
    with counting:                               # counts the collectives DTensor issues
        y = tp(xt)
        (y * probe(y)).sum().backward()
    yd = dense(xd)
    (yd * probe(yd)).sum().backward()
    dense_grads = dict(dense.named_parameters())
    gaps[str(dtype)[6:]] = {"output": (y - yd).abs().max().item(), "grad x": (xt.grad - xd.grad).abs().max().item(),
                            **{"grad " + name.replace(".", " "): (p.grad.full_tensor() - dense_grads[name].grad).abs().max().item()
                               for name, p in tp.named_parameters()}}
per_pass = counting.comm_module_counts["Global"]   # the float32 run's
report(placements={name: str(p.placements) for name, p in tp.named_parameters()},
       local_shapes={name: list(p.to_local().shape) for name, p in tp.named_parameters()},
       forward_comms={str(op): n for op, n in per_pass["forward"].items()},
       backward_comms={str(op): n for op, n in per_pass["backward"].items()}, gaps=gaps,
       grad_is_dtensor=all(isinstance(p.grad, DTensor) for p in tp.parameters()),
       local_numel=sum(p.to_local().numel() for p in tp.parameters()),
       dense_numel=sum(p.numel() for p in dense.parameters()))
del tp, mesh, y, xt, counting  # all that holds the mesh's groups, so that they are freed
gc.collect()  # in destroy_process_group() below, while Python runs: freed at interpreter exit, they can abort a rank
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
