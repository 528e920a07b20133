"""GPipe and 1F1B on four ranks, every operation paced to a fixed slot: the schedules' own timelines."""
import copy
import os
import time

import torch
import torch.distributed as dist

from fourcard_helpers import detect, report, load_mnist, exit_without_teardown
from fourcard_helpers.models import MnistCNN
from fourcard_helpers.schedules import pipeline_order   # the same function as in the lesson (a test checks it)
from pipeline_step import train_step                    # scripts/pipeline_step.py, written by the lesson

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)

def now():
    if cards.kind == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()

CUTS, BATCH = [0, 3, 6, 9, 10], 64
PACE = (0.030, 0.060)  # every forward is given 30 ms, every backward 60 ms (see the lesson)
torch.manual_seed(0)
layers = MnistCNN().as_sequential()
images, labels = load_mnist("train").tensors
x, y = images[:BATCH].to(device), labels[:BATCH].to(device)
with torch.no_grad():  # the shape of one sample where this stage's input comes in
    input_shape = tuple(layers[:CUTS[rank]](images[:1]).shape[1:])
stage = layers[CUTS[rank]:CUTS[rank + 1]].to(device)
stage64 = copy.deepcopy(stage).double()  # the same stage in float64, for the exactness check

dist.barrier()  # with NCCL, the first call on the group must involve every rank
train_step(stage, pipeline_order("1F1B", world, 4)[rank], x, y, 4, input_shape, device)  # warm-up, not recorded
runs = []
for schedule in ("GPipe", "1F1B"):
    for micro_batches in (1, 2, 4, 8, 16):
        order = pipeline_order(schedule, world, micro_batches)[rank]
        stage.zero_grad()
        stage64.zero_grad()
        dist.barrier()
        events, peak = train_step(stage, order, x, y, micro_batches, input_shape, device, pace=PACE, now=now)
        dist.barrier()
        train_step(stage64, order, x.double(), y, micro_batches, input_shape, device)  # the same in float64, unpaced
        grads = [torch.cat([p.grad.flatten() for p in part.parameters()]) for part in (stage, stage64)]
        runs.append(dict(schedule=schedule, micro_batches=micro_batches, events=events, peak=peak,
                         grads=grads[0], grads64=grads[1]))
report(runs=runs, pace=PACE)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
