"""How much wall time does a notebook launch add to a bare `torchrun`?

    python benchmarks/launch_overhead.py [--repeats 5] [--limit 0.10]

Times the same 4-rank script (init a gloo group, one all_reduce, report, tear down) launched
three ways, alternating so that machine load hits all of them alike:
  * bare:     torchrun --standalone --nproc-per-node=4 script.py
  * function: fourcard_helpers.torchrun(script)
  * magic:    %%torchrun -n 4 in an IPython shell
and prints the medians. Exits 1 when the magic's median exceeds the bare median by more than
--limit (default 10%). Timing belongs here, not in the pass/fail tests.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from IPython.core.interactiveshell import InteractiveShell

from fourcard_helpers.launch import torchrun
from fourcard_helpers.rundir import THREADS_ENV

SCRIPT = """
import torch, torch.distributed as dist
from fourcard_helpers import report
dist.init_process_group("gloo")
value = torch.ones(1024)
dist.all_reduce(value)
report(total=value[0].item())
dist.destroy_process_group()
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--limit", type=float, default=0.10)
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    script = folder / "job.py"
    script.write_text(SCRIPT)
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "fourcard_helpers")
    bare_command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", str(script)]

    def bare() -> None:
        subprocess.run(bare_command, check=True, capture_output=True, env={**os.environ, THREADS_ENV: "1"})

    def function() -> None:
        torchrun(script, nproc=4, echo=False)

    def magic() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            shell.run_cell_magic("torchrun", "-n 4", SCRIPT)

    times: dict[str, list[float]] = {"bare": [], "function": [], "magic": []}
    ways = {"bare": bare, "function": function, "magic": magic}
    for _ in range(options.repeats):
        for name, way in ways.items():
            started = time.perf_counter()
            way()
            times[name].append(time.perf_counter() - started)
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, median in medians.items():
        spread = ", ".join(f"{t:.2f}" for t in times[name])
        print(f"{name:>8}: median {median:.2f} s  ({spread})")
    overhead = medians["magic"] / medians["bare"] - 1
    print(f"%%torchrun costs {overhead:+.1%} wall time against bare torchrun (limit {options.limit:+.0%})")
    return 0 if overhead <= options.limit else 1


if __name__ == "__main__":
    sys.exit(main())
