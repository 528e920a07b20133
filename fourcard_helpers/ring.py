"""Ring attention's two rules, the sequence's layouts and two rings, for lesson 14's scripts.

Lesson 14 defines all of them in its own cells, where it teaches them; this is the copy its four-rank scripts
import, and tests/lessons/test_lesson_copies.py keeps the two equal.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of the queries at positions `q_pos` to the keys and values at `k_pos` (a query sees the keys at
    or before its position; each must see at least one). Returns the output and, for each query, the log of the sum of
    the exponentials of its scores: what merging with another block of keys needs."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.exp(scores - lse) @ v, lse


def merge(out_a: torch.Tensor | None, lse_a: torch.Tensor | None, out_b: torch.Tensor, lse_b: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention over two blocks of keys from each block's output and log-sum-exp: each output was normalised by
    its own block's sum, so reweight both by their share of the joint sum (the online-softmax rule)."""
    if out_a is None:
        return out_b, lse_b
    lse = torch.logaddexp(lse_a, lse_b)
    return torch.exp(lse_a - lse) * out_a + torch.exp(lse_b - lse) * out_b, lse


def chunk_positions(rank: int, n: int, length: int, balanced: bool) -> list[torch.Tensor]:
    """The positions of the sequence rank `rank` of `n` holds: one consecutive quarter, or (balanced) the sequence cut
    in 2n chunks and the rank holding chunk `rank` and chunk 2n - 1 - rank, a front and a back one."""
    if not balanced:
        size = length // n
        return [torch.arange(rank * size, (rank + 1) * size)]
    size = length // (2 * n)
    return [torch.arange(c * size, (c + 1) * size) for c in (rank, 2 * n - 1 - rank)]


def pass_round(x: torch.Tensor, to: int = 1) -> Callable[[], torch.Tensor]:
    """Start sending `x` to the rank `to` places on round the ring and receiving what the rank `to` places back sends;
    return a function that waits for both and gives what arrived. The send and the receive are posted together,
    before either is waited for, so every rank can send while it receives (on NCCL, as one group); whatever runs
    between this call and the wait overlaps the transfer. gloo and NCCL move contiguous memory only, so the block is
    sent contiguous and received into a contiguous buffer (`empty_like` alone would copy a transposed `x`'s strides)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    arrived = torch.empty_like(x, memory_format=torch.contiguous_format)
    requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, x.contiguous(), (rank + to) % n),
                                       dist.P2POp(dist.irecv, arrived, (rank - to) % n)])

    def wait() -> torch.Tensor:
        for request in requests:
            request.wait()
        return arrived
    return wait


def causal_pairs(mine: list[torch.Tensor], theirs: list[torch.Tensor]) -> list[tuple[int, int]]:
    """The (query chunk, key chunk) pairs where some query sees some key: a chunk of keys that starts after a chunk
    of queries' last position adds nothing to it."""
    return [(i, j) for i, q_pos in enumerate(mine) for j, k_pos in enumerate(theirs) if k_pos[0] <= q_pos[-1]]


def ring_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int, balanced: bool,
                 shift: Callable[[torch.Tensor], Callable[[], torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal ring attention of this rank's queries to the whole sequence: the output and its log-sum-exp. `q`, `k`,
    `v` (..., positions, d) hold this rank's chunks of `chunk_positions`, side by side; `shift(kv)` is called before
    a block's arithmetic and returns a function, called after it, that gives the next block. Whether the transfer
    overlaps the arithmetic is the shift's: `pass_round` posts it at once; `ring_attention`'s posts and waits only
    when the next block is asked for, after the arithmetic."""
    rank, n = dist.get_rank(), dist.get_world_size()
    mine = [c.to(q.device) for c in chunk_positions(rank, n, length, balanced)]
    outs, lses = [None] * len(mine), [None] * len(mine)
    qs = q.split([len(c) for c in mine], dim=-2)
    kv = torch.stack([k, v])                              # keys and values travel together, as one message
    for step in range(n):
        arriving = shift(kv) if step < n - 1 else None   # pass_round: the next block travels during this arithmetic
        theirs = [c.to(q.device) for c in chunk_positions((rank - step) % n, n, length, balanced)]
        ks, vs = (t.split([len(c) for c in theirs], dim=-2) for t in kv)
        for i, j in causal_pairs(mine, theirs):
            outs[i], lses[i] = merge(outs[i], lses[i], *attend(qs[i], ks[j], vs[j], mine[i], theirs[j]))
        if arriving is not None:
            kv = arriving()
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-2)


class RingShift(torch.autograd.Function):
    """Section 2's shift: forward passes a block on round the ring; backward sends its gradient back where it came
    from. Each direction posts its send and receive and waits for both in one call, so no arithmetic runs during
    the transfer. Autograd keeps every block that arrives, for backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return pass_round(x, 1)()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return pass_round(grad, -1)()


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int, balanced: bool) -> torch.Tensor:
    """Section 2's ring as a function: autograd keeps, for backward, every block of keys and values that arrives and
    every block's scores and probabilities. Its transfers do not overlap its arithmetic: `RingShift` runs when the
    next block is asked for, after the block at hand has been computed with (section 2's timeline shows the
    overlapped schedule)."""
    return ring_forward(q, k, v, length, balanced, lambda kv: lambda: RingShift.apply(kv))[0]


class LeanRingAttention(torch.autograd.Function):
    """Causal ring attention that keeps for backward only this rank's own queries, keys, values, output and
    log-sum-exp. Backward passes the keys and values round the ring a second time and recomputes each block's
    probabilities from them; the gradients of a block's keys and values travel with the block and, after the last
    rank, go home. `LeanRingAttention.apply(q, k, v, length, balanced)`, shaped as `ring_forward`'s."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int, balanced: bool) -> torch.Tensor:
        out, lse = ring_forward(q, k, v, length, balanced, pass_round)   # no graph: blocks dropped as they pass
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.length, ctx.balanced = length, balanced
        return out

    @staticmethod
    def backward(ctx, d_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        rank, n = dist.get_rank(), dist.get_world_size()
        mine = [c.to(q.device) for c in chunk_positions(rank, n, ctx.length, ctx.balanced)]
        sizes = [len(c) for c in mine]
        qs, d_outs, lses = (t.split(sizes, dim=-2) for t in (q, d_out, lse))
        deltas = (d_out * out).sum(-1, keepdim=True).split(sizes, dim=-2)   # per query: Σ p · (d_out · value)
        dq = torch.zeros_like(q)
        dqs = dq.split(sizes, dim=-2)
        kv = torch.stack([k, v])
        for step in range(n):
            arriving = pass_round(kv) if step < n - 1 else None     # the keys and values go round a second time
            dkv = torch.zeros_like(kv) if step < 2 else gradients_arriving()   # this block's gradients so far
            theirs = [c.to(q.device) for c in chunk_positions((rank - step) % n, n, ctx.length, ctx.balanced)]
            (ks, vs), (dks, dvs) = ((t.split([len(c) for c in theirs], dim=-2) for t in pair) for pair in (kv, dkv))
            for i, j in causal_pairs(mine, theirs):
                scores = qs[i] @ ks[j].transpose(-2, -1) / math.sqrt(q.shape[-1])
                scores = scores.masked_fill(theirs[j][None, :] > mine[i][:, None], float("-inf"))
                p = torch.exp(scores - lses[i])              # the block's probabilities, recomputed: whole-row sums
                dvs[j].add_(p.transpose(-2, -1) @ d_outs[i])
                d_scores = p * (d_outs[i] @ vs[j].transpose(-2, -1) - deltas[i]) / math.sqrt(q.shape[-1])
                dqs[i].add_(d_scores @ ks[j])
                dks[j].add_(d_scores.transpose(-2, -1) @ qs[i])
            if step == 0:
                own = dkv                                    # my block's gradients from my queries wait at home
            else:
                gradients_arriving = pass_round(dkv)         # they follow their block; after the last rank, home
            if arriving is not None:
                kv = arriving()
        if n > 1:
            own = own + gradients_arriving()                 # the other ranks' parts, home after the last rank
        return dq, own[0], own[1], None, None
