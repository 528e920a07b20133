import argparse
import itertools
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, DistributedSampler

from comm_meter import CountBytes, accuracy, clock, flat_weights, model_state_bytes, peak_memory
from fourcard_helpers import detect, load_mnist, report, exit_without_teardown
from fourcard_helpers.models import MnistCNN

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)   # measured steps (after 2 warm-up steps), 64 digits each
parser.add_argument("--dtypes", default="float32,float64")  # float64: the same training again, rounded far finer (section 1)
args = parser.parse_args()
STEPS, GLOBAL_BATCH, LR = args.steps, 64, 3e-3
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
train_set, test_set = load_mnist("train"), load_mnist("test")

for dtype, (strategy, shape) in itertools.product(args.dtypes.split(","), (("tensor parallel", (1, world)),
                                                                          ("2×2: data × tensor", (2, world // 2)))):
    DTYPE = getattr(torch, dtype)
    mesh = init_device_mesh(cards.kind, shape, mesh_dim_names=("dp", "tp"))
    dp, dp_rank = mesh["dp"].get_group(), mesh["dp"].get_local_rank()
    torch.manual_seed(0)
    model = MnistCNN().to(device, DTYPE)            # fc1 split by columns, fc2 by rows (lesson 08);
    # fc1's 50 outputs split unevenly (13, 13, 13, 11): its output stays a DTensor, which knows the whole shape
    plan = {"fc1": ColwiseParallel(use_local_output=False), "fc2": RowwiseParallel()}
    parallelize_module(model, mesh["tp"], plan)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)  # the convolutions are replicated
    # A tensor-parallel group shares one batch; with 2 groups, each gets half of every batch.
    sampler, first_of_group = DistributedSampler(train_set, shape[0], dp_rank, seed=0), mesh["tp"].get_local_rank() == 0
    loader = DataLoader(train_set, GLOBAL_BATCH // shape[0], sampler=sampler, drop_last=True)
    if cards.kind == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    counter, fed = CountBytes(), 0                  # fed: digits of its group's batches, counted on its first card
    with counter:
        for step, (x, y) in enumerate(itertools.islice(loader, STEPS + 2)):
            if step == 2:                               # steps 0 and 1 warm up: not timed, not counted
                warm, started = counter.reset(), clock(device)
            F.cross_entropy(model(x.to(device, DTYPE)), y.to(device)).backward()
            fed += len(x) if first_of_group else 0
            if shape[0] > 1:                        # data parallel across groups: average gradients
                for p in model.parameters():
                    grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                    dist.all_reduce(grad, group=dp)
                    grad /= shape[0]
            optimizer.step()
            optimizer.zero_grad()
    seconds = clock(device) - started
    state = model_state_bytes(list(model.parameters()), optimizer)
    full = MnistCNN().to(device, DTYPE)             # gather the shards into a plain model to test it
    full.load_state_dict({k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()})
    result = dict(cards=world, samples=fed, samples_per_s=STEPS * GLOBAL_BATCH / seconds, warmup=warm,
                  bytes_per_step=counter.bytes / STEPS, messages_per_step=counter.calls / STEPS,
                  state_bytes=state, peak_memory=peak_memory(device), accuracy=accuracy(full, test_set, device),
                  weights=flat_weights(full, rank == 0))
    report(**{strategy if dtype == "float32" else f"{strategy} in {dtype}": result})
    if rank == 0:
        print(f"{strategy:18} {dtype}: {result['samples_per_s']:5.0f} samples/s, accuracy {result['accuracy']:.1%}", flush=True)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
