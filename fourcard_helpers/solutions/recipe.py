"""A reference solution for lesson 13b's build exercise: nanoGPT's optimizer and learning-rate schedule, for a
model sharded by FSDP2 or held whole (the same code: a DTensor's dim() is the whole tensor's)."""
from __future__ import annotations

import math

import torch


def configure_optimizer(model, steps, warmup, peak):
    """AdamW with nanoGPT's two groups (weight decay 0.1 on every parameter of two or more dimensions, none on the
    norms) and betas, and a LambdaLR: a linear warm-up to `peak`, then a cosine down to a tenth of it."""
    decay = [p for p in model.parameters() if p.dim() >= 2]     # the matrices and the embedding tables
    keep = [p for p in model.parameters() if p.dim() < 2]       # the norms' scales and shifts
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": keep, "weight_decay": 0.0}],
                                  lr=peak, betas=(0.9, 0.95))

    def factor(step):                                           # × the peak at this step: nanoGPT's get_lr
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / (steps - 1 - warmup)))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
