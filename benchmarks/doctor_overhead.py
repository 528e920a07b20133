"""What the DDP doctor costs a launch.

    python benchmarks/doctor_overhead.py [--repeats 5] [--limit 0.02]

Launches the same 4-rank DDP training (the case-study CNN, 40 optimizer steps with a
DistributedSampler, so every hook of the doctor fires) with the doctor on and off,
alternating so that machine load hits both alike, and prints the medians. Exits 1 when the
doctor's median costs more than --limit (default 2%) of the launch's. Timing belongs here,
not in the pass/fail tests.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from fourcard_helpers.launch import torchrun

SCRIPT = """
import torch, torch.nn.functional as F, torch.distributed as dist
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from fourcard_helpers import MnistCNN
dist.init_process_group("gloo")
data = TensorDataset(torch.randn(2560, 1, 28, 28), torch.randint(0, 10, (2560,)))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=16, sampler=sampler)
model = DDP(MnistCNN())
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(1):
    sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
dist.destroy_process_group()
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--limit", type=float, default=0.02)
    options = parser.parse_args()
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(options.repeats):
        for doctor in (False, True):
            started = time.perf_counter()
            torchrun(SCRIPT, nproc=4, echo=False, doctor=doctor)
            times[doctor].append(time.perf_counter() - started)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"doctor off: median {off:.2f} s  {[round(t, 2) for t in times[False]]}")
    print(f"doctor on:  median {on:.2f} s  {[round(t, 2) for t in times[True]]}")
    print(f"cost: {(on - off) / off:+.1%} of a launch (limit {options.limit:.0%})")
    return 0 if (on - off) / off <= options.limit else 1


if __name__ == "__main__":
    sys.exit(main())
