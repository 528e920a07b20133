"""Exercise 3 (lesson 08): the 2 x 2 mesh's tensor- and data-parallel groups, made by hand with new_group."""
import os

import torch
import torch.distributed as dist

from fourcard_helpers import detect, report, exit_without_teardown

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)

# your code here: make the four groups (every rank makes every group, in the same order), then set
# tp_group and dp_group to the two this rank is in
raise NotImplementedError

sums = {}
for name, group in (("tp", tp_group), ("dp", dp_group)):
    value = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(value, group=group)          # only the group's ranks take part
    sums[name] = value.item()
report(groups={"tp": dist.get_process_group_ranks(tp_group), "dp": dist.get_process_group_ranks(dp_group)}, sums=sums)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
