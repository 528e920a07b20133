"""Ranks out of step, read in each rank's flight recorder: its last collectives, and the line that called each."""
import os
import pickle
from datetime import timedelta

import torch
import torch.distributed as dist

from fourcard_helpers import detect, report, exit_without_teardown

cards = detect(int(os.environ["LOCAL_WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
# gloo on every machine (on NCCL a failed collective ends the process); 20 s: a backstop, not the point
steps_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=20))
batches = 3 if rank == 3 else 4  # an uneven split of the data: rank 3 has one batch fewer
loss = torch.ones(1)
failed = None
try:
    for step in range(batches):
        dist.all_reduce(loss, group=steps_group)  # each step's all-reduce (of gradients, in a real loop)
except RuntimeError as error:  # rank 3 has left the loop and ended: the others' last all-reduce fails
    failed = f"step {step + 1}: {type(error).__name__}"
# The record, on by default: its last collectives (a private function; the tutorial's NCCL one is _dump_nccl_trace)
record = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
script = os.path.basename(__file__)
report(failed=failed, calls=[
    (entry["collective_seq_id"], entry["profiling_name"],
     next(frame["line"] for frame in entry["frames"] if frame["filename"].endswith(script)))
    for entry in record["entries"]])
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
