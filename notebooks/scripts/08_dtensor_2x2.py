"""Four cards as a 2 × 2 grid: tensor parallel within each row, data parallel across the rows."""
import copy, gc, os, torch, torch.distributed as dist, sys
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from fourcard_helpers import detect, report

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

torch.manual_seed(0)
dense = MLP().to(device)
x, target = torch.randn(16, 32, device=device), torch.zeros(16, 32, device=device)
grid = init_device_mesh(cards.kind, (2, 2), mesh_dim_names=("dp", "tp"))
dp_group = grid["dp"].get_group()
groups = {"dp": dist.get_process_group_ranks(dp_group), "tp": dist.get_process_group_ranks(grid["tp"].get_group())}
tp2 = parallelize_module(copy.deepcopy(dense), grid["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})

half = grid["dp"].get_local_rank()                 # each tensor-parallel pair takes half of the batch
loss = ((tp2(x.chunk(2)[half]) - target.chunk(2)[half]) ** 2).mean()
loss.backward()
dp_bytes = 0
for p in tp2.parameters():                         # data parallel: average each gradient shard with its twin
    g = p.grad.to_local()
    dp_bytes += g.nbytes
    dist.all_reduce(g, group=dp_group)
    g /= 2
((dense(x) - target) ** 2).mean().backward()       # the reference: whole batch, one dense model
dense_grads = dict(dense.named_parameters())
gap = max((p.grad.full_tensor() - dense_grads[name].grad).abs().max().item() for name, p in tp2.named_parameters())
report(groups=groups, dp_bytes=dp_bytes, gap_2x2=gap)
del tp2, p, loss, grid, dp_group  # all that holds the mesh's groups, so that they are freed
gc.collect()  # in destroy_process_group() below, while Python runs: freed at interpreter exit, they can abort a rank
dist.destroy_process_group()
sys.stdout.flush(); os._exit(0)  # skip Python's teardown, which can abort a gloo rank (lesson 00)
