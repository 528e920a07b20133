"""Lesson 13's small GPT: a character-level transformer that learns to write Tang quatrains.

The layout is nanoGPT's (embeddings, pre-norm blocks of causal self-attention and an MLP, a final
norm, an output layer tied to the token embedding), with the layer names of torchtitan's
tensor-parallel plans: attention keeps separate `wq`, `wk`, `wv` and `wo` (nanoGPT fuses the first
three), the MLP `w1` and `w2`, so that a plan can split each layer by columns or by rows on its own.
Lesson 13 defines the model, `get_batch` and `Checkpointed` in its own cells; its four-rank scripts import this copy
(tests/lessons/test_lesson_copies.py keeps the two equal). `poem_tokens` is the plumbing: the shipped poems as numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
import torch.utils.checkpoint
import torch.nn.functional as F
from torch import nn

POEMS = Path(__file__).resolve().parent.parent / "data" / "tang_quatrains.txt"  # one quatrain a line (data/README.md)


@lru_cache(maxsize=1)
def poem_tokens() -> tuple[torch.Tensor, tuple[str, ...]]:
    """The shipped poems as one stream of character numbers, and the characters (the vocabulary, sorted, newline
    first): a character is a token, so every rank and the notebook number them the same way."""
    text = POEMS.read_text(encoding="utf-8")
    chars = tuple(sorted(set(text)))
    number = {c: i for i, c in enumerate(chars)}
    return torch.tensor([number[c] for c in text]), chars


def get_batch(tokens: torch.Tensor, batch_size: int, block_size: int, generator: torch.Generator
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch_size` windows of `block_size` characters from random places in the text, and the same windows one
    character later: at every position, the character the model must predict."""
    starts = torch.randint(len(tokens) - block_size, (batch_size,), generator=generator).tolist()
    x = torch.stack([tokens[s:s + block_size] for s in starts])
    y = torch.stack([tokens[s + 1:s + block_size + 1] for s in starts])
    return x, y


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int = 64  # the longest context in characters (a seven-character quatrain is 32 and its newline)
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64


class Attention(nn.Module):
    """Causal self-attention: each position takes a weighted mean of the values at itself and before it."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.head_dim = config.d_model // config.n_head
        self.wq = nn.Linear(config.d_model, config.d_model, bias=False)
        self.wk = nn.Linear(config.d_model, config.d_model, bias=False)
        self.wv = nn.Linear(config.d_model, config.d_model, bias=False)
        self.wo = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time = x.shape[:2]
        # (batch, time, heads, head_dim) → (batch, heads, time, head_dim). The number of heads is read off the
        # tensor (-1), not the config: split by columns over the cards, each card holds only some of the heads.
        q, k, v = (w(x).view(batch, time, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # the mask: no position sees a later one
        return self.wo(y.transpose(1, 2).reshape(batch, time, -1))


class MLP(nn.Module):
    """Position by position: widen four times, GELU, narrow back."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.d_model, 4 * config.d_model, bias=False)
        self.w2 = nn.Linear(4 * config.d_model, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    """Pre-norm: each sub-layer reads a normalised copy and adds its result to the residual stream."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.d_model)
        self.attention = Attention(config)
        self.mlp_norm = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    """Characters in, for each position the logits of the next character out (and the loss, given targets)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_embeddings = nn.Embedding(config.block_size, config.d_model)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = nn.LayerNorm(config.d_model)
        self.output = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.output.weight = self.tok_embeddings.weight  # tied: one matrix reads characters in and scores them out
        for name, p in self.named_parameters():  # GPT-2's initialisation, as nanoGPT's
            if p.dim() == 2:
                # the layers that add to the residual stream start smaller, so that its size does not grow with depth
                std = 0.02 / math.sqrt(2 * config.n_layer) if name.endswith(("wo.weight", "w2.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_embeddings(idx) + self.pos_embeddings(positions)
        for layer in self.layers:
            x = layer(x)
        logits = self.output(self.norm(x))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


class Checkpointed(nn.Module):
    """Activation checkpointing of one block: forward keeps only the block's input; backward runs the block again
    to get back what it needs, up to the last tensor backward uses (the last product, w2, does not run again).
    Memory for time: most of one more forward pass of the block, none of its activations kept."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)
