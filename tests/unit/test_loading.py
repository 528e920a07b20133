"""Lesson 04's loading helpers: costed samples, batch fetching, per-worker seeding, spawn-safety."""
import pickle

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from fourcard_helpers.loaders import BatchIndexSampler, SyntheticCostDataset


def test_synthetic_dataset_samples_are_digit_sized_and_deterministic():
    a, b = SyntheticCostDataset(64, cost_us=0, seed=3), SyntheticCostDataset(64, cost_us=0, seed=3)
    image, label = a[5]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32
    assert 0 <= int(label) < 10 and len(a) == 64
    assert torch.equal(a[5][0], b[5][0])
    with pytest.raises(ValueError):
        SyntheticCostDataset(4, kind="gpu")


def test_synthetic_dataset_pickles_with_its_calibration():
    dataset = SyntheticCostDataset(16, cost_us=50)
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy.loops == dataset.loops > 0
    assert torch.equal(copy[3][0], dataset[3][0])


@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_index_sampler_covers_every_index_once(drop_last):
    sampler = BatchIndexSampler(10, 4, drop_last=drop_last)
    batches = list(sampler)
    assert len(batches) == len(sampler) == (2 if drop_last else 3)
    seen = torch.cat(batches)
    assert len(set(seen.tolist())) == len(seen) == (8 if drop_last else 10)
    assert not torch.equal(torch.cat(list(sampler)), seen)  # reshuffled next epoch, with or without drop_last


def test_batch_index_sampler_loader_gives_whole_batches():
    x, y = torch.arange(20.0).reshape(10, 2), torch.arange(10)
    loader = DataLoader(TensorDataset(x, y), sampler=BatchIndexSampler(10, 5), batch_size=None)
    for xb, yb in loader:
        assert xb.shape == (5, 2) and torch.equal(xb[:, 0], 2.0 * yb)
