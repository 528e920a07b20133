"""Lesson 13's GPT (fourcard_helpers/gpt.py): its parameters, its causal mask, its tied output and its start."""
from __future__ import annotations

import math

import torch

from fourcard_helpers.gpt import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=101, block_size=16, n_layer=2, n_head=4, d_model=32)


def model(config: GPTConfig = CONFIG) -> GPT:
    torch.manual_seed(0)
    return GPT(config).double()


def test_the_parameter_count_is_the_sum_of_its_layers_with_the_output_matrix_counted_once() -> None:
    v, t, d, n = CONFIG.vocab_size, CONFIG.block_size, CONFIG.d_model, CONFIG.n_layer
    per_block = 4 * d * d + 2 * 4 * d * d + 2 * 2 * d  # attention, MLP, two LayerNorms (weight and bias)
    counted = sum(p.numel() for p in model().parameters())  # parameters() yields a shared tensor once
    assert counted == v * d + t * d + n * per_block + 2 * d
    m = model()
    assert m.output.weight is m.tok_embeddings.weight


def test_no_position_sees_a_later_one() -> None:
    m = model()
    idx = torch.randint(CONFIG.vocab_size, (2, CONFIG.block_size), generator=torch.Generator().manual_seed(1))
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % CONFIG.vocab_size  # other characters from position 10 on
    before, after = m(idx)[0], m(changed)[0]
    assert torch.equal(before[:, :10], after[:, :10])  # the first ten positions' logits: bit for bit the same
    assert not torch.allclose(before[:, 10:], after[:, 10:])


def test_at_the_start_every_character_is_about_equally_likely() -> None:
    m = model()
    idx = torch.randint(CONFIG.vocab_size, (8, CONFIG.block_size), generator=torch.Generator().manual_seed(2))
    _, loss = m(idx[:, :-1], idx[:, 1:])
    assert abs(loss.item() - math.log(CONFIG.vocab_size)) < 0.05  # ln(vocab): the loss of a uniform guess


def test_a_gradient_step_on_the_output_moves_the_embedding_too() -> None:
    m = model()
    idx = torch.randint(CONFIG.vocab_size, (4, CONFIG.block_size), generator=torch.Generator().manual_seed(3))
    _, loss = m(idx[:, :-1], idx[:, 1:])
    loss.backward()
    grad = m.tok_embeddings.weight.grad
    untouched = sorted(set(range(CONFIG.vocab_size)) - set(idx[:, :-1].flatten().tolist()))
    assert untouched and grad[untouched].abs().sum() > 0  # rows never read as input still learn through the output
