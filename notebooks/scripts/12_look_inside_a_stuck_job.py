"""A job stuck for good, looked into from outside: `py-spy dump`, and faulthandler's stacks on SIGUSR1.

By hand: `torchrun --nproc-per-node=4 scripts/12_look_inside_a_stuck_job.py --until /tmp/go`; in a second
terminal, `pgrep -f -- '-u .*12_look_inside'` lists the four ranks (torchrun starts each as `python -u`);
`py-spy dump --pid PID` (with sudo where
`kernel.yama.ptrace_scope` is 1) and `kill -USR1 PID` for each; then `touch /tmp/go` lets the job end.
"""
import argparse
import faulthandler
import os
import signal
import sys
import time
from pathlib import Path

import torch.distributed as dist

from fourcard_helpers import detect, report

faulthandler.register(signal.SIGUSR1)  # kill -USR1 PID: write each thread's stack to stderr, then go on
parser = argparse.ArgumentParser()
parser.add_argument("--until", type=Path, help="rank 3 is stuck until this file exists (without it: for 5 s)")
args = parser.parse_args()
cards = detect(int(os.environ["LOCAL_WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank = dist.get_rank()


def stuck(until: Path | None) -> None:
    """A dead disk, a deadlock, ...: here, a file that is not there yet."""
    if until is None:
        time.sleep(5)
    while until is not None and not until.exists():
        time.sleep(0.1)


if rank == 3:
    stuck(args.until)  # rank 3 is stuck here
dist.barrier()  # ranks 0, 1 and 2 wait here for rank 3
report(pid=os.getpid())
dist.destroy_process_group()
sys.stdout.flush(); os._exit(0)  # skip Python's teardown, which can abort a gloo rank (lesson 00)
