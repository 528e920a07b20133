"""One training step of a 4-block MLP as data ×4, tensor ×4 and data ×2 · tensor ×2: what each card holds and sends."""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from fourcard_helpers import detect, report, exit_without_teardown

cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
torch.manual_seed(0)
d, blocks, batch = 64, 4, 32               # per block: fc1 d → 4d, ReLU, fc2 4d → d, as nn.Linear makes them
params = [[p.detach().to(device) for fc in (torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d))
           for p in (fc.weight, fc.bias)] for _ in range(blocks)]
x, target = torch.randn(batch, d).to(device), torch.randn(batch, d).to(device)   # drawn on the CPU, as in the notebook
sent = {}                                   # payload bytes this rank hands to each kind of communication

def all_reduce(t, group, kind):                 # a group of one rank has nothing to send
    if dist.get_world_size(group) > 1:
        sent[kind] = sent.get(kind, 0) + t.nbytes
        dist.all_reduce(t, group=group)
    return t

class TensorParallelComm(torch.autograd.Function):
    """f (forward=False: nothing forward, all-reduce backward) and g (forward=True: the reverse), in one."""
    @staticmethod
    def forward(ctx, t, group, forward):
        ctx.group, ctx.forward = group, forward
        return all_reduce(t.clone(), group, "tensor") if forward else t.view_as(t)
    @staticmethod
    def backward(ctx, grad):
        return (grad if ctx.forward else all_reduce(grad.contiguous(), ctx.group, "tensor")), None, None

def step(dp, tp, dtype=torch.float32):
    """One step with dp copies of the model, each split Megatron-style over tp ranks, in `dtype`."""
    replica, part = divmod(rank, tp)               # which copy of the model, which shard of it
    sent.clear()
    groups = [dist.new_group(list(range(r * tp, r * tp + tp))) for r in range(dp)]  # every rank creates
    groups += [dist.new_group(list(range(p, world, tp))) for p in range(tp)]         # every group, in order
    tp_group, dp_group = groups[replica], groups[dp + part]
    local = [[p.to(dtype).clone().requires_grad_() for p in (w1.chunk(tp, 0)[part], b1.chunk(tp, 0)[part],
                                                   w2.chunk(tp, 1)[part], b2)] for w1, b1, w2, b2 in params]
    weights, kept = {p.data_ptr() for ps in local for p in ps}, {}
    def pack(t):                                   # every tensor autograd saves for backward, weights aside
        kept[t.data_ptr()] = 0 if t.data_ptr() in weights else t.numel()
        return t
    out = x.chunk(dp)[replica].to(dtype)           # data parallel: this copy's slice of the batch
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for w1, b1, w2, b2 in local:
            hidden = torch.relu(F.linear(TensorParallelComm.apply(out, tp_group, False), w1, b1))
            out = TensorParallelComm.apply(F.linear(hidden, w2), tp_group, True) + b2
        ((out - target.chunk(dp)[replica].to(dtype)) ** 2).mean().backward()
    grads = torch.cat([p.grad.flatten() for ps in local for p in ps])
    all_reduce(grads, dp_group, "data").div_(dp)   # data parallel: average every gradient over the copies
    return {"sent": dict(sent), "numbers_held": grads.numel(), "activations": sum(kept.values()), "grads": grads}

layouts = {"data ×4": (4, 1), "tensor ×4": (1, 4), "data ×2 · tensor ×2": (2, 2)}
report(results={name: step(*shape) for name, shape in layouts.items()}, layouts=layouts, d=d, blocks=blocks, batch=batch,
       grads64={name: step(*shape, torch.float64)["grads"] for name, shape in layouts.items()})  # the same step in float64
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
