"""A stuck job: where is each rank? faulthandler writes every rank's Python stack while it waits."""
import faulthandler
import os
import sys
import time

import torch
import torch.distributed as dist

from fourcard_helpers import detect, exit_without_teardown

cards = detect(int(os.environ["LOCAL_WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
dist.barrier()  # all four have started: the watchdogs count from here
faulthandler.dump_traceback_later(4)  # still running in 4 s? Then write every thread's stack to stderr
if rank == 3:
    time.sleep(8)  # stuck: a dead disk, a deadlock, ...
    sys.exit("rank 3: stuck for 8 s, ended for this demonstration")
dist.barrier()  # ranks 0, 1 and 2 wait here for rank 3
faulthandler.cancel_dump_traceback_later()
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
