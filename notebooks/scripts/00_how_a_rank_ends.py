"""How a rank ends: gloo's threads outlive destroy_process_group() while anything holds the group, as DDP leaves it held."""
import gc
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from fourcard_helpers import report, exit_without_teardown


def gloo_threads():
    """The names of the threads gloo runs in this process (Linux lists every thread, by name, in /proc).
    A new thread carries the process's name until it names itself: wait (10 s at most) until only one does."""
    deadline = time.monotonic() + 10
    while True:
        names = [open(f"/proc/self/task/{task}/comm").read().strip() for task in os.listdir("/proc/self/task")]
        if names.count(open("/proc/self/comm").read().strip()) == 1 or time.monotonic() > deadline:
            return sorted(name for name in names if "gloo" in name)
        time.sleep(0.01)


dist.init_process_group("gloo")  # gloo on every machine: its threads are what this launch looks at
rank = dist.get_rank()
threads = {}
second = dist.new_group()                        # a second group: gloo starts threads for it too
dist.all_reduce(torch.ones(1), group=second)
threads["two groups"] = gloo_threads()
dist.destroy_process_group(second)               # nothing else holds it: its threads end here
del second
threads["second destroyed"] = gloo_threads()
model = DDP(torch.nn.Linear(4, 4))               # DDP holds the default group...
imported_by_ddp = "torch.distributed.nn.functional" in sys.modules   # this script has not imported it (yet)
from torch.distributed.nn import functional      # ...and so does this module, which DDP's constructor imported
holders = [name for name, f in vars(functional).items()
           if callable(f) and dist.group.WORLD in (getattr(f, "__defaults__", None) or ())]
dist.destroy_process_group()
threads["all destroyed"] = gloo_threads()
del model
gc.collect()
threads["DDP deleted too"] = gloo_threads()
print(f"rank {rank}: {len(threads['DDP deleted too'])} gloo threads still run after destroy_process_group() and del model")
report(threads=threads, holders=holders, imported_by_ddp=imported_by_ddp)
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
