"""The same 1F1B pipeline with real compute only, no pacing: what four ranks on this machine achieve."""
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

CUTS, BATCH, REPEATS = [0, 3, 6, 9, 10], 256, 3
torch.manual_seed(0)
layers = MnistCNN().as_sequential()
images, labels = load_mnist("train").tensors
x, y = images[:BATCH].to(device), labels[:BATCH].to(device)
with torch.no_grad():  # the shape of one sample where this stage's input comes in
    input_shape = tuple(layers[:CUTS[rank]](images[:1]).shape[1:])
stage = layers[CUTS[rank]:CUTS[rank + 1]].to(device)

dist.barrier()
train_step(stage, pipeline_order("1F1B", world, 4)[rank], x, y, 4, input_shape, device)  # warm-up, not recorded
runs = []
for repeat in range(REPEATS):           # alternate the settings, so that machine noise hits them alike
    for micro_batches in (1, 4, 16):
        dist.barrier()
        events, _ = train_step(stage, pipeline_order("1F1B", world, micro_batches)[rank], x, y, micro_batches,
                               input_shape, device, now=now)
        runs.append(dict(repeat=repeat, micro_batches=micro_batches, events=events))
report(runs=runs, batch=BATCH)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
