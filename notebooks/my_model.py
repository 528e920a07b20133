"""A model and data set of your own for `scripts/train_any.py`: which waveform is this?

Each sample is 64 noisy readings of one of four waveforms (sine, square, triangle, sawtooth)
at a random frequency and phase; a small 1-D convolutional network names the waveform.
Nothing the course used before, and nothing to download: the data are generated from a seed.

    torchrun --nproc-per-node=4 scripts/train_any.py --model my_model:build_model \\
        --data my_model:build_datasets --strategy ddp --epochs 3
"""
import math

import torch
from torch import nn
from torch.utils.data import TensorDataset

KINDS = ("sine", "square", "triangle", "sawtooth")
LENGTH = 64  # readings per sample


def waves(count: int, seed: int) -> TensorDataset:
    """`count` noisy waveforms as (1 × LENGTH readings, index into KINDS) pairs."""
    g = torch.Generator().manual_seed(seed)
    kind = torch.randint(0, len(KINDS), (count,), generator=g)
    periods = 1 + 3 * torch.rand(count, 1, generator=g)  # 1 to 4 periods in the window
    phase = torch.rand(count, 1, generator=g)
    where = (periods * torch.arange(LENGTH) / LENGTH + phase) % 1  # position within the period, 0-1
    shapes = torch.stack([torch.sin(2 * math.pi * where), torch.sign(0.5 - where),
                          1 - 4 * (where - 0.5).abs(), 2 * where - 1])
    readings = shapes[kind, torch.arange(count)] + 0.3 * torch.randn(count, LENGTH, generator=g)
    return TensorDataset(readings.unsqueeze(1), kind)


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv1d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
        nn.Conv1d(16, 32, 5, padding=2), nn.ReLU(), nn.AdaptiveAvgPool1d(1),
        nn.Flatten(), nn.Linear(32, len(KINDS)),
    )


def build_datasets() -> tuple[TensorDataset, TensorDataset]:
    return waves(2000, seed=0), waves(500, seed=1)
