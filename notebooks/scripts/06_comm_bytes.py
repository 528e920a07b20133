import itertools
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.data import DataLoader, DistributedSampler

from fourcard_helpers import detect, report, load_mnist, MnistCNN, exit_without_teardown

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
sent, plain_all_reduce = [], dist.all_reduce  # bytes of every all-reduce this rank starts
def counting_all_reduce(tensor, *args, **kwargs):
    sent.append(tensor.numel() * tensor.element_size())
    return plain_all_reduce(tensor, *args, **kwargs)
dist.all_reduce = counting_all_reduce         # the comm hooks call dist.all_reduce: count it
def bf16_hook(group, bucket):
    # default_hooks.bf16_compress_hook, written out: the built-in needs a build with CUDA and NCCL >= 2.10.
    compressed = bucket.buffer().to(torch.bfloat16).div_(world)
    future = dist.all_reduce(compressed, group=group, async_op=True).get_future()
    return future.then(lambda done: bucket.buffer().copy_(done.value()[0]))

HOOKS = {
    "DDP (fp32)": default_hooks.allreduce_hook,      # what DDP does by default, as a hook
    "DDP + no_sync ×4": default_hooks.allreduce_hook,
    "DDP + fp16 hook": default_hooks.fp16_compress_hook,
    "DDP + bf16 hook": default_hooks.bf16_compress_hook if cards.backend == "nccl" else bf16_hook,
    "DDP, convolutions frozen": default_hooks.allreduce_hook,   # counted for Exercise 3, not printed
}
if cards.backend != "nccl":                   # try the built-in: it checks the build, not the backend
    try:
        DDP(MnistCNN().to(device)).register_comm_hook(dist.group.WORLD, default_hooks.bf16_compress_hook)
    except TypeError as error:
        report(bf16_builtin_refused=str(error))
data = load_mnist("train")
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
batches = [(x.to(device), y.to(device)) for x, y in itertools.islice(DataLoader(data, batch_size=32, sampler=sampler), 12)]
for mode, hook in HOOKS.items():
    torch.manual_seed(0)
    module = MnistCNN().to(device)
    if "frozen" in mode:                       # fine-tuning: the convolutions stay as they are
        module.conv1.requires_grad_(False)
        module.conv2.requires_grad_(False)
    model = DDP(module)
    model.register_comm_hook(dist.group.WORLD, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    micro = 4 if "no_sync" in mode else 1           # micro-batches per optimizer step
    stream, sent_per_step = iter(batches), []
    for step in range(3):
        sent.clear()
        for i in range(micro):
            x, y = next(stream)
            with model.no_sync() if i < micro - 1 else nullcontext():   # all-reduce on the last only
                (F.cross_entropy(model(x), y) / micro).backward()
        optimizer.step()
        optimizer.zero_grad()
        sent_per_step.append(sum(sent))
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    card0 = weights.clone()
    dist.broadcast(card0, src=0)   # card 0's weights, on every card
    report(**{mode: {"bytes_per_step": sent_per_step, "micro_batches": micro,
                     "replicas_agree": torch.equal(weights, card0)}})   # bit for bit
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
