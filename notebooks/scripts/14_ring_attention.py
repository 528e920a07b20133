"""Ring attention by hand on four ranks, causal, float64, the sequence in consecutive quarters then balanced. Reports
each rank's positions, output and gradients, the bytes it sent forward and backward, and the score entries it used."""
import os

import torch
import torch.distributed as dist

from fourcard_helpers import detect, report, exit_without_teardown
from fourcard_helpers.ring import attend, chunk_positions, merge

T, HEADS, HEAD_DIM = 256, 4, 16
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
sent = {"forward": 0, "backward": 0}

def shift(x: torch.Tensor, to: int, phase: str) -> torch.Tensor:   # to the rank `to` places on; from `to` back
    received = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x.contiguous(), (rank + to) % world), dist.P2POp(dist.irecv, received, (rank - to) % world)]
    for op in dist.batch_isend_irecv(ops):
        op.wait()
    sent[phase] += x.nbytes
    return received

class RingShift(torch.autograd.Function):   # forward: the block moves on a rank; backward: its gradient goes back
    @staticmethod
    def forward(ctx, x):
        return shift(x, 1, "forward")

    @staticmethod
    def backward(ctx, grad):
        return shift(grad, -1, "backward")

torch.manual_seed(0)  # the whole sequence and the gradient of the output, the same on every rank: each takes its part
q, k, v, grad_out = (torch.randn(HEADS, T, HEAD_DIM, dtype=torch.float64) for _ in range(4))
results = {}
for layout in ("consecutive", "balanced"):
    chunks = chunk_positions(rank, world, T, balanced=layout == "balanced")
    mine = torch.cat(chunks)
    my_q, my_k, my_v = (t[:, mine].to(device).requires_grad_() for t in (q, k, v))
    sent.update(forward=0, backward=0)
    kv, work = torch.cat([my_k, my_v]), 0                 # keys and values travel together, as one message
    outs, lses = [None] * len(chunks), [None] * len(chunks)
    for step in range(world):
        if step:
            kv = RingShift.apply(kv)                      # now holding the block of rank (rank - step) mod world
        their = chunk_positions((rank - step) % world, world, T, balanced=layout == "balanced")
        k_blocks, v_blocks = (t.split([len(c) for c in their], dim=1) for t in kv.chunk(2))
        for i, (q_pos, q_part) in enumerate(zip(chunks, my_q.split([len(c) for c in chunks], dim=1))):
            for k_pos, k_part, v_part in zip(their, k_blocks, v_blocks):
                if k_pos[0] <= q_pos[-1]:                 # skip a block whose every key is after every query
                    out, lse = attend(q_part, k_part, v_part, q_pos.to(device), k_pos.to(device))
                    outs[i], lses[i] = merge(outs[i], lses[i], out, lse)
                    work += int((k_pos[None, :] <= q_pos[:, None]).sum())   # score entries a query really uses
    out = torch.cat(outs, dim=1)
    loss = (out * grad_out[:, mine].to(device)).sum()
    torch.autograd.backward([loss, kv], [None, torch.zeros_like(kv)])  # kv as a second root (adding zero) makes
    # every shift run its backward on every rank, even a shift whose blocks this rank never used: the ring waits for it
    results[layout] = {"positions": mine.tolist(), "work": work, "sent": dict(sent),
                       **{name: t.detach().cpu().tolist() for name, t in
                          (("out", out), ("dq", my_q.grad), ("dk", my_k.grad), ("dv", my_v.grad))}}
report(**results)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)


