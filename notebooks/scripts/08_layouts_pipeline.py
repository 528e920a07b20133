"""The same 4-block MLP as pipeline ×4 and data ×2 · pipeline ×2: what each card holds and sends."""
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
d, blocks, batch = 64, 4, 32               # the same model, weights and batch as the previous script
params = [[p.detach().to(device) for fc in (torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d))
           for p in (fc.weight, fc.bias)] for _ in range(blocks)]
x, target = torch.randn(batch, d).to(device), torch.randn(batch, d).to(device)   # drawn on the CPU, as in the notebook
sent = {}                                   # payload bytes this rank sends, by kind

def step(dp, pp, dtype=torch.float32):
    """One step with dp copies of the model, each cut into pp stages of consecutive blocks (one micro-batch)."""
    replica, stage = divmod(rank, pp)              # which copy of the model, which stage of it
    sent.clear()
    groups = [dist.new_group(list(range(s, world, pp))) for s in range(pp)]  # every rank creates every group
    first, last = stage == 0, stage == pp - 1
    local = [[p.to(dtype).clone().requires_grad_() for p in params[b]] for b in range(stage * blocks // pp, (stage + 1) * blocks // pp)]
    weights, kept = {p.data_ptr() for ps in local for p in ps}, {}
    def pack(t):                                   # every tensor autograd saves for backward, weights aside
        kept[t.data_ptr()] = 0 if t.data_ptr() in weights else t.numel()
        return t
    rows = batch // dp
    inp = x.chunk(dp)[replica].to(dtype) if first else torch.empty(rows, d, dtype=dtype, device=device)
    if not first:                                  # the previous stage's output is this stage's input
        dist.recv(inp, src=rank - 1)
        inp.requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = inp
        for w1, b1, w2, b2 in local:
            out = F.linear(torch.relu(F.linear(out, w1, b1)), w2, b2)
        if last:
            ((out - target.chunk(dp)[replica].to(dtype)) ** 2).mean().backward()
    if not last:                                   # send the output on; receive its gradient back
        dist.send(out.detach(), dst=rank + 1)
        sent["pipeline"] = sent.get("pipeline", 0) + out.nbytes
        grad = torch.empty_like(out)
        dist.recv(grad, src=rank + 1)
        out.backward(grad)
    if not first:                                  # send the gradient of our input back
        dist.send(inp.grad, dst=rank - 1)
        sent["pipeline"] = sent.get("pipeline", 0) + inp.grad.nbytes
    grads = torch.cat([p.grad.flatten() for ps in local for p in ps])
    if dp > 1:                                     # data parallel: average every gradient over the copies
        sent["data"] = grads.nbytes
        dist.all_reduce(grads, group=groups[stage])
        grads /= dp
    return {"sent": dict(sent), "numbers_held": grads.numel(), "activations": sum(kept.values()), "grads": grads}

layouts = {"pipeline ×4": (1, 4), "data ×2 · pipeline ×2": (2, 2)}
report(results={name: step(*shape) for name, shape in layouts.items()}, layouts=layouts, d=d, blocks=blocks, batch=batch,
       grads64={name: step(*shape, torch.float64)["grads"] for name, shape in layouts.items()})  # the same step in float64
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
