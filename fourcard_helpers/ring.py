"""Ring attention's two rules and the sequence's layouts, for lesson 14's scripts.

Lesson 14 defines `attend`, `merge` and `chunk_positions` in its own cells, where it teaches them; this is the copy its
four-rank scripts import, and tests/test_lesson_copies.py keeps the two equal.
"""
from __future__ import annotations

import math

import torch


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
