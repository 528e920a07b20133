"""Lesson 14's mixture of experts: the layer (`MoE`), its capacity (`within_capacity`) and its expert-parallel forward
(`expert_parallel`).

The lesson defines all three in its own cells, where it explains them; this is the copy its four-rank scripts import
(tests/lessons/test_lesson_copies.py keeps the two equal). Each expert is lesson 13's MLP (d → 4d → d).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd

from .gpt import MLP, GPTConfig


def within_capacity(chosen: torch.Tensor, n_experts: int, capacity_factor: float | None) -> torch.Tensor:
    """Which of the token-assignments `chosen` (tokens, k) their experts take: each expert at most
    ceil(capacity_factor · assignments / experts), every token's first choice served before any token's second
    (GShard's priority), each in order of position; all of them without a capacity factor. The capacity is a share of
    the assignments given: of a batch on one card, of a card's own tokens on several."""
    if capacity_factor is None:
        return torch.ones_like(chosen, dtype=torch.bool)
    capacity = math.ceil(capacity_factor * chosen.numel() / n_experts)
    by_choice = chosen.t().flatten()                      # every token's first choice, then every second...
    one_hot = F.one_hot(by_choice, n_experts)             # ...each in order of position
    place = (one_hot.cumsum(0) * one_hot).sum(1)           # 1 for an expert's first assignment, 2 its second...
    return (place <= capacity).view(chosen.shape[1], -1).t()   # back to (tokens, k)


class MoE(nn.Module):
    """A mixture of experts in the MLP's place: a router scores each token against every expert, the token goes to
    its `top_k` best, and its output is their outputs weighted by the router's probabilities (Switch Transformer's
    weighting: the softmax over all experts, not renormalised over the chosen). With a `capacity_factor`, each expert
    takes at most ceil(capacity_factor · assignments / experts) of them and drops the rest; it serves every token's
    first choice before any token's second (GShard's priority), each in order of position.

    `forward` returns the output alone, so that the layer takes the MLP's place in a Block unchanged; what a training
    loop or a lesson needs from the last forward stays on the layer: `aux_loss` (the load-balancing loss, in the
    graph), `counts` (assignments per expert) and `kept` (those within capacity)."""

    def __init__(self, d_model: int, n_experts: int, top_k: int = 1, capacity_factor: float | None = None) -> None:
        super().__init__()
        self.top_k, self.capacity_factor = top_k, capacity_factor
        self.router = nn.Linear(d_model, n_experts)   # with a bias (Switch's, Mixtral's have none): to tilt it at will
        self.experts = nn.ModuleList(MLP(GPTConfig(vocab_size=0, d_model=d_model)) for _ in range(n_experts))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For each token (a row of `x`): its probabilities over the experts, its `top_k` experts (best first) and
        their probabilities, which weight their outputs."""
        probabilities = torch.softmax(self.router(x), dim=-1)
        weights, chosen = probabilities.topk(self.top_k, dim=-1)
        return probabilities, chosen, weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The output at every position of `x`. Each expert runs once, on all of its tokens together: one matrix
        product per expert and layer, as large as its share of the tokens."""
        tokens = x.reshape(-1, x.shape[-1])                       # (batch, time, d) → (tokens, d)
        probabilities, chosen, weights = self.route(tokens)
        n_experts = len(self.experts)
        self.counts = torch.bincount(chosen.flatten(), minlength=n_experts)
        shares = self.counts.to(probabilities.dtype) / chosen.numel()      # f: a count, so no gradient flows through it
        self.aux_loss = n_experts * (shares * probabilities.mean(0)).sum()  # E · Σ f_i · P_i; Switch's for k = 1
        keep = within_capacity(chosen, n_experts, self.capacity_factor)
        self.kept = torch.bincount(chosen[keep], minlength=n_experts)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where((chosen == e) & keep)       # this expert's tokens, in order of position
            out = out.index_add(0, token, weights[token, slot, None] * expert(tokens[token]))
        return out.view_as(x)                                     # a dropped assignment adds nothing: zero


def expert_parallel(moe: MoE, x: torch.Tensor, group: dist.ProcessGroup | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's output for this rank's tokens `x` (tokens, d), computed with this rank running only its own
    experts (rank r of `group`, by default of all ranks: experts r·m to r·m + m − 1, m = experts per rank), and how
    many rows each of them received from each rank, as [(rank 0, my first expert), (rank 0, my second), (rank 1, my
    first), ...]. The tokens stay where they are and travel only to be computed, within the group: there and back,
    by two all-to-alls. With the layer's `capacity_factor`, the rank applies it to its own tokens (its share of every
    expert's capacity): a dropped assignment never leaves."""
    group = group or dist.group.WORLD
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    per_rank = len(moe.experts) // world
    _, chosen, weights = moe.route(x)                         # this rank's replica of the router, its own tokens
    going = torch.where(within_capacity(chosen, len(moe.experts), moe.capacity_factor).flatten())[0]
    expert = chosen.flatten()[going]                          # one entry per kept token-assignment, by position
    order = going[torch.argsort(expert, stable=True)]         # grouped by expert, each group still in order of position
    token = order // moe.top_k                                # the token each sorted assignment carries
    send = torch.bincount(expert, minlength=len(moe.experts))  # rows for each expert: for each rank, its experts' rows
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)       # the sizes first: what each rank will receive
    to_rank = send.view(world, per_rank).sum(1).tolist()
    from_rank = received.view(world, per_rank).sum(1).tolist()
    rows = all_to_all_single_autograd(x[token], from_rank, to_rank, group)      # dispatch
    pieces = list(rows.split(received.tolist()))              # one piece per (rank, expert), as `received` lists them
    for j in range(per_rank):                                 # each of my experts on all of its rows at once
        mine = moe.experts[rank * per_rank + j]
        pieces[j::per_rank] = mine(torch.cat(pieces[j::per_rank])).split(received[j::per_rank].tolist())
    results = all_to_all_single_autograd(torch.cat(pieces), to_rank, from_rank, group)  # combine
    return torch.zeros_like(x).index_add(0, token, weights.flatten()[order, None] * results), received
