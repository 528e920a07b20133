"""Ring attention's forward on four ranks, timed: each rank posts the send of the keys and values it holds and the
receive of the next block, computes on the block it holds, then waits for what is left of the transfer; and, as the
baseline, computes first and only then sends and waits. Causal, float32, the sequence cut in consecutive quarters and
balanced. Reports each rank's timelines: (what, start, end) in seconds from a common start, "compute" or "wait"."""
import os
import time

import torch
import torch.distributed as dist

from fourcard_helpers import detect, report, exit_without_teardown
from fourcard_helpers.ring import attend, chunk_positions, merge

T, HEADS, HEAD_DIM = 4096, 4, 16
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
torch.manual_seed(0)
q, k, v = (torch.randn(HEADS, T, HEAD_DIM) for _ in range(3))
timelines = {"overlapped": {}, "compute, then send": {}}
runs = [("overlapped", "consecutive"), ("overlapped", "balanced")]   # the first two warm up; the last four count
for schedule, layout in runs + [(s, l) for s in timelines for l in ("consecutive", "balanced")]:
    overlap = schedule == "overlapped"
    chunks = chunk_positions(rank, world, T, balanced=layout == "balanced")
    mine = torch.cat(chunks)
    my_q, kv = q[:, mine].to(device), torch.cat([k[:, mine], v[:, mine]]).to(device)
    outs, lses, events = [None] * len(chunks), [None] * len(chunks), []
    dist.barrier()
    start = time.perf_counter()
    now = lambda: (torch.cuda.current_stream().synchronize() if cards.kind == "cuda" else None,   # the arithmetic's
                   time.perf_counter() - start)[1]                                            # stream, not the transfer's
    for step in range(world):
        incoming = torch.empty_like(kv)
        send = lambda: dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, (rank + 1) % world),
                                               dist.P2POp(dist.irecv, incoming, (rank - 1) % world)])
        if step < world - 1 and overlap:                  # post the transfer first, then compute while it runs
            transfer = send()
        their = chunk_positions((rank - step) % world, world, T, balanced=layout == "balanced")
        k_blocks, v_blocks = (t.split([len(c) for c in their], dim=1) for t in kv.chunk(2))
        began = now()
        for i, (q_pos, q_part) in enumerate(zip(chunks, my_q.split([len(c) for c in chunks], dim=1))):
            for k_pos, k_part, v_part in zip(their, k_blocks, v_blocks):
                if k_pos[0] <= q_pos[-1]:                 # skip a block whose every key is after every query
                    out, lse = attend(q_part, k_part, v_part, q_pos.to(device), k_pos.to(device))
                    outs[i], lses[i] = merge(outs[i], lses[i], out, lse)
        events.append(("compute", began, now()))
        if step < world - 1:
            waited = now()
            for work in (transfer if overlap else send()):   # the baseline sends only now, its arithmetic done
                work.wait()
            events.append(("wait", waited, now()))        # what the arithmetic did not hide (the baseline: all)
            kv = incoming
    timelines[schedule][layout] = events
report(timelines=timelines)
dist.destroy_process_group()
exit_without_teardown()  # gloo can abort a finished rank in Python's teardown (lesson 00)


