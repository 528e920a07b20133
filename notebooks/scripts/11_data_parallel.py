import argparse
import itertools
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
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
mesh = init_device_mesh(cards.kind, (world,))  # FSDP2's cards: its default is CUDA in any CUDA build
train_set, test_set = load_mnist("train"), load_mnist("test")

for dtype, strategy in itertools.product(args.dtypes.split(","), ("single card", "DDP", "DDP, no_sync ×2", "FSDP2")):
    n = 1 if strategy == "single card" else world      # cards this strategy uses
    micro = 2 if "no_sync" in strategy else 1           # micro-batches per optimizer step
    if rank < n:
        torch.manual_seed(0)                            # the same initial weights everywhere
        model = MnistCNN().to(device, getattr(torch, dtype))
        if strategy.startswith("DDP"):
            model = DDP(model, device_ids=[device] if cards.kind == "cuda" else None)
        elif strategy == "FSDP2":
            for layer in model.children():              # each layer a unit: gathered, used, freed
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        sampler = DistributedSampler(train_set, n, rank, shuffle=True, seed=0)  # this card's share of each batch
        loader = DataLoader(train_set, GLOBAL_BATCH // n // micro, sampler=sampler, drop_last=True)
        if cards.kind == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        counter, fed = CountBytes(), 0                  # fed: digits this card trained on
        with counter:
            for i, (x, y) in enumerate(itertools.islice(loader, (STEPS + 2) * micro)):
                if i == 2 * micro:                      # steps 0 and 1 warm up: not timed, not counted
                    warm, started = counter.reset(), clock(device)
                last = i % micro == micro - 1
                quiet = model.no_sync() if micro > 1 and not last else nullcontext()
                with quiet:                             # no_sync: keep the gradient, skip the all-reduce
                    (F.cross_entropy(model(x.to(device, getattr(torch, dtype))), y.to(device)) / micro).backward()
                fed += len(x)
                if last:
                    optimizer.step()
                    optimizer.zero_grad()
        seconds = clock(device) - started
        result = dict(cards=n, samples=fed, samples_per_s=STEPS * GLOBAL_BATCH / seconds, warmup=warm,
                      bytes_per_step=counter.bytes / STEPS, messages_per_step=counter.calls / STEPS,
                      state_bytes=model_state_bytes(list(model.parameters()), optimizer), weights=flat_weights(model, rank == 0),
                      peak_memory=peak_memory(device), accuracy=accuracy(model, test_set, device))
        report(**{strategy if dtype == "float32" else f"{strategy} in {dtype}": result})
        if rank == 0:
            print(f"{strategy:16} {dtype}: {result['samples_per_s']:5.0f} samples/s, accuracy {result['accuracy']:.1%}", flush=True)
    dist.barrier()                                      # the other cards wait while one card trains alone
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
