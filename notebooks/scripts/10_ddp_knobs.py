"""DDP's knobs on the case study: buckets, gradients as bucket views, static graph, buffers, unused parameters."""
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from fourcard_helpers import detect, load_mnist, report, exit_without_teardown
from fourcard_helpers.models import MnistCNNWithBatchNorm

ROUNDS, STEPS = 2, 5  # timing: each round times every setting for STEPS steps
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
images, labels = (t.to(device) for t in load_mnist("train")[rank * 16:(rank + 1) * 16])
SETTINGS = {  # each differs from DDP's defaults in one knob
    "defaults": {},
    "bucket_cap_mb=1e-6 (one bucket per parameter)": dict(bucket_cap_mb=1e-6),
    "bucket_cap_mb=0.03": dict(bucket_cap_mb=0.03),
    "gradient_as_bucket_view=True": dict(gradient_as_bucket_view=True),
    "static_graph=True": dict(static_graph=True),
    "forward_sync_buffers=False": dict(forward_sync_buffers=False),
    "find_unused_parameters=True": dict(find_unused_parameters=True),
}
models, optimizers = {}, {}
for name, knobs in SETTINGS.items():
    torch.manual_seed(0)
    models[name] = DDP(MnistCNNWithBatchNorm().to(device), device_ids=[device] if cards.kind == "cuda" else None, **knobs)
    optimizers[name] = torch.optim.SGD(models[name].parameters(), lr=0.05)


def step(name: str) -> None:
    optimizers[name].zero_grad()
    torch.nn.functional.cross_entropy(models[name](images), labels).backward()
    optimizers[name].step()
    if cards.kind == "cuda":
        torch.cuda.synchronize()  # wait for the GPU before reading a clock


times = {name: [] for name in SETTINGS}
for round_ in range(ROUNDS + 1):  # round 0 is warm-up (DDP rebuilds its buckets after the first step)
    for name in SETTINGS:  # alternate the settings, so that a busy moment of the machine hits all alike
        dist.barrier()
        started = time.perf_counter()
        for _ in range(STEPS):
            step(name)
        if round_ > 0:
            times[name].append((time.perf_counter() - started) / STEPS)
found = {}
for name, model in models.items():
    with torch.profiler.profile() as prof:  # count the collectives of one step
        step(name)
    calls = [event.name for event in prof.events()]
    storages = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}  # where the gradients live
    found[name] = dict(all_reduces=calls.count("c10d::allreduce_"), broadcasts=calls.count("c10d::broadcast_"),
                       searches=calls.count("torch.distributed.ddp.reducer::search_unused_parameters"),
                       grad_storages=len(storages), step_ms=1000 * statistics.median(times[name]))
report(found=found)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
