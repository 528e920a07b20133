"""Lesson 13b's reference recipe against nanoGPT's own arithmetic, in this process: its LambdaLR gives, step by step,
the rates nanoGPT's `get_lr` gives (written below as nanoGPT's train.py writes it, with lr_decay_iters the last
step and min_lr a tenth of the peak), and so does the lesson's script; its groups are nanoGPT's
`configure_optimizers` rule, every parameter of two or more dimensions decayed."""
from __future__ import annotations

import ast
import math

import torch

from fourcard_helpers.gpt import GPT, GPTConfig
from fourcard_helpers.solutions import configure_optimizer
from helpers import NOTEBOOK_DIR

STEPS, WARMUP, PEAK = 12, 3, 3e-3


def nanogpt_get_lr(it: int, learning_rate: float, warmup_iters: int, lr_decay_iters: int, min_lr: float) -> float:
    """nanoGPT's train.py, get_lr."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def test_the_reference_schedule_is_nanogpts_and_so_is_the_scripts() -> None:
    model = GPT(GPTConfig(vocab_size=24, block_size=8, n_layer=2, n_head=4, d_model=16))
    optimizer, scheduler = configure_optimizer(model, STEPS, WARMUP, PEAK)
    given = []
    for _ in range(STEPS):
        given.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    nanogpt = [nanogpt_get_lr(it, PEAK, WARMUP, STEPS - 1, PEAK / 10) for it in range(STEPS)]
    assert all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(given, nanogpt)), (given, nanogpt)
    script = (NOTEBOOK_DIR / "scripts" / "13b_gpt_recipe.py").read_text(encoding="utf-8")
    node = next(n for n in ast.parse(script).body if isinstance(n, ast.FunctionDef) and n.name == "lr_factor")
    namespace: dict = {"math": math, "args": type("Args", (), {"warmup": WARMUP, "steps": STEPS})}
    exec(ast.get_source_segment(script, node), namespace)  # noqa: S102 - the script's own schedule
    assert all(math.isclose(PEAK * namespace["lr_factor"](it), b, rel_tol=1e-12) for it, b in enumerate(nanogpt))


def test_the_reference_groups_are_nanogpts_rule() -> None:
    model = GPT(GPTConfig(vocab_size=24, block_size=8, n_layer=2, n_head=4, d_model=16))
    optimizer, _ = configure_optimizer(model, STEPS, WARMUP, PEAK)
    names = {id(p): name for name, p in model.named_parameters()}
    decayed = {names[id(p)] for group in optimizer.param_groups if group["weight_decay"] == 0.1 for p in group["params"]}
    kept = {names[id(p)] for group in optimizer.param_groups if group["weight_decay"] == 0.0 for p in group["params"]}
    assert decayed == {n for n, p in model.named_parameters() if p.dim() >= 2} and "tok_embeddings.weight" in decayed
    assert kept == {n for n, p in model.named_parameters() if p.dim() < 2} and decayed | kept == set(names.values())
    assert all(group["betas"] == (0.9, 0.95) for group in optimizer.param_groups)
    assert isinstance(optimizer, torch.optim.AdamW)
