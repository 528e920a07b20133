"""Gradient accumulation under DDP: four micro-batches per step, with and without no_sync, all-reduces counted."""
import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from fourcard_helpers import detect, load_mnist, report, exit_without_teardown
from fourcard_helpers.models import MnistCNN

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
    torch.backends.cudnn.allow_tf32 = False  # full float32, to compare with the notebook's CPU reference
images, labels = (t[:256].to(device) for t in load_mnist("train").tensors)
micro = [slice(64 * k + 16 * rank, 64 * k + 16 * (rank + 1)) for k in range(4)]  # this rank's 4 × 16 digits

calls = {"all-reduces": 0, "bytes": 0}


def counting_allreduce(state, bucket):
    """DDP calls this hook instead of its own all-reduce, once per bucket: we count, then all-reduce as DDP does."""
    calls["all-reduces"] += 1
    calls["bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
    return default_hooks.allreduce_hook(state, bucket)


torch.manual_seed(0)
model = DDP(MnistCNN().to(device), device_ids=[device] if cards.kind == "cuda" else None)
model.register_comm_hook(None, counting_allreduce)


def accumulate(net, use_no_sync):
    """One optimizer step's gradient from 4 micro-batches; returns it and the communication it took."""
    net.zero_grad()
    calls.update({"all-reduces": 0, "bytes": 0})
    dtype = next(net.parameters()).dtype
    for k, part in enumerate(micro):
        quiet = use_no_sync and k < len(micro) - 1  # the last backward always synchronises what has accumulated
        with net.no_sync() if quiet else contextlib.nullcontext():  # forward and backward inside no_sync
            (F.cross_entropy(net(images[part].to(dtype)), labels[part]) / len(micro)).backward()
    return [p.grad.clone() for p in net.parameters()], dict(calls)


grads_every, comm_every = accumulate(model, use_no_sync=False)
grads_no_sync, comm_no_sync = accumulate(model, use_no_sync=True)
torch.manual_seed(0)  # the same start, accumulated once more in float64 (no hook): for the notebook's exact check
grads_64, _ = accumulate(DDP(MnistCNN().to(device, torch.float64), device_ids=model.device_ids), use_no_sync=True)
print(f"accumulating 4 micro-batches: {comm_every} without no_sync, {comm_no_sync} with it", flush=True)
report(comm_every=comm_every, comm_no_sync=comm_no_sync, accumulated_grad=[g.cpu() for g in grads_no_sync],
       accumulated_grad_64=[g.cpu() for g in grads_64],
       accumulation_gap=max((a - b).abs().max().item() for a, b in zip(grads_every, grads_no_sync)))
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
