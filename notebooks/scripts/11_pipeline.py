import argparse
import itertools
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.utils.data import DataLoader, DistributedSampler

from comm_meter import CountBytes, accuracy, clock, flat_weights, model_state_bytes, peak_memory
from fourcard_helpers import detect, load_mnist, report, exit_without_teardown
from fourcard_helpers.models import MnistCNN

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)   # measured steps (after 2 warm-up steps), 64 digits each
parser.add_argument("--dtypes", default="float32,float64")  # float64: the same training again, rounded far finer (section 1)
args = parser.parse_args()
STEPS, GLOBAL_BATCH, LR, MICRO_BATCHES = args.steps, 64, 3e-3, 4
CUTS = [0, 3, 6, 9, 10]  # card r runs layers CUTS[r]:CUTS[r+1] of the model as nn.Sequential
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
train_set, test_set = load_mnist("train"), load_mnist("test")

for dtype in args.dtypes.split(","):
    DTYPE = getattr(torch, dtype)
    torch.manual_seed(0)                              # every card builds the whole model...
    layers = MnistCNN().as_sequential().to(device, DTYPE)
    part = layers[CUTS[rank]:CUTS[rank + 1]]          # ...and trains only its own stage
    stage = PipelineStage(part, rank, world, device)
    schedule = Schedule1F1B(stage, n_microbatches=MICRO_BATCHES, loss_fn=F.cross_entropy)
    optimizer = torch.optim.AdamW(part.parameters(), lr=LR)
    # Every card walks the single card's shuffle; the first card feeds the images, the last the labels.
    loader = DataLoader(train_set, GLOBAL_BATCH, sampler=DistributedSampler(train_set, 1, 0, seed=0), drop_last=True)
    if cards.kind == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    counter, fed = CountBytes(), 0                    # fed: digits this card fed into the pipeline
    with counter:
        for step, (x, y) in enumerate(itertools.islice(loader, STEPS + 2)):
            if step == 2:                             # steps 0 and 1 warm up: not timed, not counted
                warm, started = counter.reset(), clock(device)
            if rank == 0:
                schedule.step(x.to(device, DTYPE))
                fed += len(x)
            elif rank == world - 1:
                schedule.step(target=y.to(device))
            else:
                schedule.step()
            optimizer.step()
            optimizer.zero_grad()
    seconds = clock(device) - started
    state = model_state_bytes(list(part.parameters()), optimizer)
    # Reassemble the trained model on every card (each stage broadcasts its layers) to test it.
    for owner in range(world):
        for p in layers[CUTS[owner]:CUTS[owner + 1]].parameters():
            dist.broadcast(p.data, src=owner)
    result = dict(cards=world, samples=fed, samples_per_s=STEPS * GLOBAL_BATCH / seconds, warmup=warm,
                  bytes_per_step=counter.bytes / STEPS, messages_per_step=counter.calls / STEPS,
                  state_bytes=state, peak_memory=peak_memory(device), accuracy=accuracy(layers, test_set, device),
                  weights=flat_weights(layers, rank == 0))
    report(**{"pipeline 1F1B" if dtype == "float32" else f"pipeline 1F1B in {dtype}": result})
    if rank == 0:
        print(f"pipeline 1F1B    {dtype}: {result['samples_per_s']:5.0f} samples/s, accuracy {result['accuracy']:.1%}", flush=True)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
