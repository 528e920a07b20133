"""How long each lesson takes top to bottom in a fresh kernel, as a learner's "Run All".

The instructor guide's schedule is built from these figures. Each notebook runs on a copy (the
stored notebooks are not touched), one after another on an otherwise quiet machine.

A machine's speed is given in the same run as the time of one bare four-rank `torchrun` launch
(a script that joins the group, meets at a barrier and leaves: the median of three), and each
lesson is also given in such launches. Another machine's figures scale roughly with that unit.

    python benchmarks/notebook_times.py [NN ...]     # all lessons, or the numbered ones
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from fourcard_helpers.rundir import GLOO_INTERFACE_ENV, THREADS_ENV

ROOT = Path(__file__).resolve().parent.parent


BARE_LAUNCH = """
import torch.distributed as dist

from fourcard_helpers import exit_without_teardown

dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
exit_without_teardown()
"""


def bare_launch_seconds(folder: Path, times: int = 3) -> float:
    """The median wall time of a bare four-rank torchrun launch on simulated cards."""
    script = folder / "bare_launch.py"
    script.write_text(BARE_LAUNCH)
    env = {**os.environ, THREADS_ENV: "1", GLOO_INTERFACE_ENV: "lo"}
    seconds = []
    for _ in range(times):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
                        str(script)], env=env, check=True, capture_output=True)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def main(numbers: list[str]) -> None:
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    if numbers:
        notebooks = [path for path in notebooks if path.name.split("_")[0] in numbers]
    print(f"{os.cpu_count()} cores; one fresh kernel per notebook")
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "notebooks"
        shutil.copytree(ROOT / "notebooks", copy)
        launch = bare_launch_seconds(Path(scratch))
        load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
        print(f"one bare 4-rank torchrun launch: {launch:.1f} s{load}", flush=True)
        total = 0.0
        for path in notebooks:
            notebook = nbformat.read(copy / path.name, as_version=4)
            started = time.perf_counter()
            NotebookClient(notebook, timeout=900, resources={"metadata": {"path": str(copy)}}).execute()
            seconds = time.perf_counter() - started
            total += seconds
            print(f"{path.stem:40s} {seconds:6.1f} s  {seconds / launch:5.0f} launches", flush=True)
        print(f"{'all':40s} {total:6.1f} s  {total / launch:5.0f} launches")


if __name__ == "__main__":
    main(sys.argv[1:])
