"""Profile a DDP step of the case study on every rank; write one Chrome trace per rank (open in ui.perfetto.dev)."""
import argparse
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function

from fourcard_helpers import detect, load_mnist, report, exit_without_teardown
from fourcard_helpers.models import MnistCNN

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--bucket-cap-mb", type=float, default=0.02, help="small buckets: several all-reduces per step")
parser.add_argument("--trace-dir", default="traces", help="where the Chrome traces go (git-ignored)")
args = parser.parse_args()

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
torch.manual_seed(0)
model = DDP(MnistCNN().to(device), device_ids=[device] if cards.kind == "cuda" else None,
            bucket_cap_mb=args.bucket_cap_mb)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
images, labels = load_mnist("train")[rank * 16:(rank + 1) * 16]  # this rank's batch of 16
images, labels = images.to(device), labels.to(device)


def step() -> None:
    optimizer.zero_grad()
    with record_function("forward"):  # named spans: they appear in the trace
        loss = F.cross_entropy(model(images), labels)
    with record_function("backward"):
        loss.backward()  # DDP all-reduces each bucket as soon as its gradients are ready
    with record_function("optimizer"):
        optimizer.step()
    if cards.kind == "cuda":
        torch.cuda.synchronize()  # GPU work is asynchronous: wait for it before reading a clock


seconds = []
for _ in range(8):  # the first steps pay one-off costs: never time them
    started = time.perf_counter()
    step()
    seconds.append(time.perf_counter() - started)
activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cards.kind == "cuda" else [])
with profile(activities=activities) as prof:
    step()
trace = Path(args.trace_dir) / f"10_ddp_step_rank{rank}.json"
trace.parent.mkdir(parents=True, exist_ok=True)
prof.export_chrome_trace(str(trace))
report(trace=str(trace), first_step_s=seconds[0], median_step_s=statistics.median(seconds[3:]))
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
