"""A stuck job: an all-reduce called on rank 0 only. A short process-group timeout turns the hang into an error."""
import datetime
import os

import torch
import torch.distributed as dist

from fourcard_helpers import detect, exit_without_teardown

cards = detect(int(os.environ["LOCAL_WORLD_SIZE"]))
dist.init_process_group(cards.backend)  # default timeout: on a busy machine start-up alone can take a while
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
# All ranks again, in a group whose collectives time out after 5 s instead of the default (30 min on gloo, 10 on
# NCCL), so that a collective nobody answers fails in seconds. (init_process_group takes the same timeout=.)
quick = dist.new_group(timeout=datetime.timedelta(seconds=5))
dist.barrier(group=quick)  # all ranks, once: NCCL builds a group's communicator at its first collective, untimed
loss = torch.tensor([0.25 + rank], device=device)
if rank == 0:  # "only rank 0 logs, so only rank 0 needs the mean loss"...
    dist.all_reduce(loss, group=quick)  # ...but an all-reduce needs all four ranks
    print(f"mean loss {loss.item() / 4:.3f}", flush=True)
dist.barrier()  # the other ranks went on to the next collective (in the job's group, default timeout)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
