import itertools
import os
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from fourcard_helpers import detect, report, load_mnist, MnistCNN, exit_without_teardown

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
sync = torch.cuda.synchronize if cards.kind == "cuda" else (lambda: None)
data = load_mnist("train")
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
batches = [(x.to(device), y.to(device)) for x, y in itertools.islice(DataLoader(data, batch_size=32, sampler=sampler), 16)]

# Six ways to run micro-batches of 32, each timed per micro-batch:
MODES = {                        # (wrapped in DDP, barrier after every micro-batch, micro-batches per step)
    "model alone": (False, False, 1),             # no communication at all
    "model alone, step every 4th": (False, False, 4),  # accumulation without DDP: 1 optimizer step in 4
    "model alone + barrier": (False, True, 1),    # synchronise the ranks, move no bytes
    "DDP, hook sends nothing": (True, False, 1),  # DDP's own work, with a comm hook that moves no bytes
    "DDP": (True, False, 1),                      # all-reduce the gradients every micro-batch
    "DDP + no_sync ×4": (True, False, 4),         # all-reduce every 4th micro-batch only
}
def send_nothing(state, bucket):  # a comm hook that hands the bucket back as it is: no bytes, no waiting
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done
models = {}
for mode, (wrapped, _, _) in MODES.items():
    torch.manual_seed(0)
    model = MnistCNN().to(device)
    lr = 0.0 if mode == "DDP, hook sends nothing" else 0.05  # unaveraged gradients differ: those replicas must not move
    models[mode] = (DDP(model) if wrapped else model, torch.optim.SGD(model.parameters(), lr=lr))
    if mode == "DDP, hook sends nothing":
        models[mode][0].register_comm_hook(None, send_nothing)

ROUNDS, WINDOW = 6, 8            # the modes take turns, so that load on a shared machine hits all alike;
                                 # each times 8 micro-batches a round, so that no median gains from a longer window
seconds = {mode: [] for mode in MODES}
stream = itertools.cycle(batches)
for round in range(ROUNDS + 1):  # round 0 is a warm-up
    for mode, (wrapped, barrier, micro) in MODES.items():
        model, optimizer = models[mode]
        dist.barrier()
        sync()
        start = time.perf_counter()
        for step in range(WINDOW // micro):
            for i in range(micro):
                x, y = next(stream)
                with model.no_sync() if wrapped and i < micro - 1 else nullcontext():
                    (F.cross_entropy(model(x), y) / micro).backward()
                if barrier:
                    dist.barrier()
            optimizer.step()
            optimizer.zero_grad()
        sync()
        if round:
            seconds[mode].append((time.perf_counter() - start) / WINDOW)
report(seconds=seconds)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
