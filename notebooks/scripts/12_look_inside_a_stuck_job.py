r"""A job stuck for good, looked into from outside: `py-spy dump`, and faulthandler's stacks on SIGUSR1.

By hand: `torchrun --nproc-per-node=4 scripts/12_look_inside_a_stuck_job.py --stuck-for 600`; in a second terminal
`pgrep -f -- '-u .*12_look_inside'` lists the four ranks (torchrun starts each as `python -u`), and
`tr '\0' '\n' < /proc/PID/environ | grep ^RANK=` tells which is which; `py-spy dump --pid PID` and
`kill -USR1 PID` for each; `kill -USR2 PID` to rank 3 lets the job end.
"""
import argparse
import ctypes
import faulthandler
import os
import signal
import time

import torch
import torch.distributed as dist

from fourcard_helpers import detect, report, exit_without_teardown

faulthandler.register(signal.SIGUSR1)  # kill -USR1 PID: write each thread's stack to stderr, then go on
# Yama's ptrace_scope 1 lets only ancestors read a process: name "any process" (PR_SET_PTRACER, PR_SET_PTRACER_ANY),
# so that py-spy from a second terminal needs no sudo. Without Yama the call fails harmlessly.
ctypes.CDLL(None).prctl(0x59616D61, ctypes.c_ulong(-1), 0, 0, 0)
parser = argparse.ArgumentParser()
parser.add_argument("--stuck-for", type=float, default=5, help="seconds rank 3 is stuck, unless sent SIGUSR2 first")
args = parser.parse_args()


class LetGo(Exception):
    """Raised in rank 3 by SIGUSR2: ends the stuck wait of this demonstration."""


def let_go(signum, frame):
    raise LetGo


signal.signal(signal.SIGUSR2, let_go)
cards = detect(int(os.environ["LOCAL_WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
if rank == 3:
    try:
        time.sleep(args.stuck_for)  # rank 3 is stuck here: a dead disk, a deadlock, ...
    except LetGo:
        pass
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # a SIGUSR2 that comes late does nothing
dist.barrier()  # ranks 0, 1 and 2 wait here for rank 3
report(pid=os.getpid())
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
