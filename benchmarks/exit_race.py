"""gloo's exit race, measured: how often a rank that finished its work still aborts, by how it ends.

A gloo worker thread wakes the rank's main thread when a collective is done and only then lets go
of it, and of the tensors it summed, which takes Python's GIL. If the script has ended by then,
Python is shutting down: it ends a thread that asks for the GIL with pthread_exit, the unwinding
C++ thread cannot be ended that way, and the process dies by SIGABRT ("terminate called without an
active exception"). Lesson 00 ("How a rank ends") explains it and shows these counts.

One four-rank script, ended four ways, each launched N times with plain torchrun:

* `teardown`: the last collective, then the end of the script (Python's teardown, nothing else);
* `destroy`: then destroy_process_group(), with nothing else holding the group: its threads are
  joined there, before Python shuts down (the control);
* `DDP + destroy`: the same, while a DDP model exists: DDP keeps the group alive, so its threads
  outlive destroy_process_group() and the race is back;
* `DDP + destroy + os._exit`: the course's ending: no Python teardown at all.

    python benchmarks/exit_race.py [--runs 40] [--busy 0] [--json notebooks/measured/exit_race.json]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from fourcard_helpers.rundir import GLOO_INTERFACE_ENV, THREADS_ENV

SCRIPT = """
import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
ending = sys.argv[1]
dist.init_process_group("gloo")
if "DDP" in ending:
    model = DDP(torch.nn.Linear(4, 4))
x = torch.ones(1000)
for _ in range(3):
    dist.all_reduce(x)
if "destroy" in ending:
    dist.destroy_process_group()
if "os._exit" in ending:
    sys.stdout.flush(); os._exit(0)
"""
ENDINGS = ("teardown", "destroy", "DDP + destroy", "DDP + destroy + os._exit")


def spin() -> None:  # a busy process: one core's worth of load
    while True:
        pass


def launch(script: Path, ending: str) -> tuple[bool, bool]:
    """(failed, aborted with gloo's exit race) for one plain four-rank launch."""
    env = {**os.environ, THREADS_ENV: "1", GLOO_INTERFACE_ENV: "lo"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
                           str(script), ending], env=env, capture_output=True, text=True, timeout=300)
    text = done.stdout + done.stderr
    return done.returncode != 0, "terminate called without an active exception" in text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40, help="launches of each ending (default 40)")
    parser.add_argument("--busy", type=int, default=0, help="busy processes beside the launches")
    parser.add_argument("--json", type=Path, help="also write the counts to this file")
    args = parser.parse_args()
    busy = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for proc in busy:
        proc.start()
    counts, load_at_start = {}, os.getloadavg()[0]
    try:
        with tempfile.TemporaryDirectory() as folder:
            script = Path(folder) / "ending.py"
            script.write_text(SCRIPT)
            for ending in ENDINGS:
                outcomes = [launch(script, ending) for _ in range(args.runs)]
                counts[ending] = {"runs": args.runs, "failed": sum(f for f, _ in outcomes),
                                  "exit_race_aborts": sum(a for _, a in outcomes)}
                print(f"{ending:26} {counts[ending]['failed']:3} of {args.runs} launches failed, "
                      f"{counts[ending]['exit_race_aborts']} of them with the exit race's abort", flush=True)
    finally:
        for proc in busy:
            proc.terminate()
            proc.join()
    if args.json:
        args.json.write_text(json.dumps({
            "command": "python benchmarks/exit_race.py " + " ".join(sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "python": platform.python_version(),
            "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} cores, {args.busy} busy processes",
            "load_average": [round(load_at_start, 1), round(os.getloadavg()[0], 1)],  # at the start and the end
            "ranks": 4, "script": SCRIPT.strip(), "endings": counts}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
