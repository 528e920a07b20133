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
shapes = [(256, 64), (256,), (16, 256), (16,)]       # a two-layer MLP held as ONE flat vector
sizes = [torch.Size(s).numel() for s in shapes]
P = sum(sizes)                                        # 20,752 numbers: divides by 4, no padding
mine = slice(rank * P // world, (rank + 1) * P // world)   # this rank's quarter of a flat vector
def forward(flat, x):                                 # the MLP reads its weights as views of `flat`
    w1, b1, w2, b2 = (t.view(s) for t, s in zip(flat.split(sizes), shapes))
    return F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2)
def adam(master, grad, m, v, t, lr=1e-2, b1=0.9, b2=0.999, eps=1e-8):   # as in the notebook
    g = grad.float()
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    master.addcdiv_(m / (1 - b1 ** t), (v / (1 - b2 ** t)).sqrt_().add_(eps), value=-lr)
def held(*tensors):                                   # bytes of distinct storages
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())
out, same, init = {}, {}, torch.randn(P, generator=torch.Generator().manual_seed(0)).to(device) * 0.05   # one start for all
warm = init.bfloat16().requires_grad_()               # a throwaway step: on a GPU the first matrix products allocate
torch.autograd.grad(forward(warm, torch.zeros(32, 64, device=device, dtype=torch.bfloat16)).sum(), warm)
del warm                                              # cuBLAS workspaces for good, which stage 0 must not count
for stage in (0, 1, 2, 3):                            # stage 0: plain DDP
    master = m = v = params = grad = None             # free the last stage's tensors, then measure
    base = torch.cuda.memory_allocated() if cards.kind == "cuda" else 0
    master = (init if stage == 0 else init[mine]).clone()          # fp32 master weights
    m, v = torch.zeros_like(master), torch.zeros_like(master)      # Adam's moments, fp32
    params = (init if stage < 3 else init[mine]).bfloat16()        # bf16 weights to compute with
    data = torch.Generator().manual_seed(rank)                     # each rank its own batches
    for t in (1, 2, 3):
        x, y = (torch.randn(32, n, generator=data).to(device, torch.bfloat16) for n in (64, 16))
        full = params
        if stage == 3:                                # gather the weights just before use...
            full = torch.empty(P, dtype=torch.bfloat16, device=device)
            dist.all_gather_single(full, params)
        full = full.detach().requires_grad_()
        grad, = torch.autograd.grad(F.mse_loss(forward(full, x), y), full)
        del full                                      # ...and free them right after
        if stage >= 2:                                # only this rank's quarter of the sum
            grad, whole_grad = torch.empty(P // world, dtype=grad.dtype, device=device), grad
            dist.reduce_scatter_single(grad, whole_grad)
            dist.all_reduce(whole_grad)               # DDP's sum of the same gradients: did both add alike, bit for bit?
            same[stage] = same.get(stage, True) and torch.equal(grad, whole_grad[mine])
            del whole_grad
        else:
            dist.all_reduce(grad)
        grad /= world
        kept = {"bf16 weights": held(params), "bf16 gradients": held(grad), "fp32 master": held(master),
                "Adam m, v": held(m, v), "cuda allocated": torch.cuda.memory_allocated() - base if cards.kind == "cuda" else None}
        adam(master, grad[mine] if stage == 1 else grad, m, v, t)
        if stage in (1, 2):                           # everyone needs every new weight
            dist.all_gather_single(params, master.bfloat16())
        else:
            params.copy_(master)
    weights = torch.empty(P, device=device)
    dist.all_gather_single(weights, master) if stage else weights.copy_(master)
    out[stage] = (kept, weights)
report(P=P, bytes={s: kept for s, (kept, _) in out.items()}, moved=(out[0][1] - init).abs().max().item(),
       gap_to_ddp={s: (w - out[0][1]).abs().max().item() for s, (_, w) in out.items()}, same_sums=same)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)
