"""Lesson 04's loading helpers in worker processes: spawn-safety, and per-worker seeding in forked workers."""
import multiprocessing
import sys

import pytest
import torch
from torch.utils.data import DataLoader

from fourcard_helpers.loaders import RandomShiftDataset, SyntheticCostDataset, seed_worker


@pytest.mark.skipif(sys.platform == "win32", reason="spawn start-up is slow on Windows CI")
def test_synthetic_dataset_works_with_spawned_workers():
    loader = DataLoader(SyntheticCostDataset(32, cost_us=10), batch_size=8, num_workers=1,
                        multiprocessing_context=multiprocessing.get_context("spawn"))
    assert sum(len(labels) for _, labels in loader) == 32


def _shifts(rng, worker_init_fn):
    images, labels = torch.zeros(8, 1, 28, 28), torch.arange(8)
    loader = DataLoader(RandomShiftDataset(images, labels, rng=rng), batch_size=2, num_workers=2,
                        worker_init_fn=worker_init_fn, generator=torch.Generator().manual_seed(0))
    return [shift for _, _, shift in loader]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork start method")
def test_own_numpy_generator_repeats_across_workers_until_seed_worker():
    buggy = _shifts("numpy", None)
    assert torch.equal(buggy[0], buggy[1])  # worker 0's first batch == worker 1's first batch
    fixed = _shifts("numpy", seed_worker)
    assert not torch.equal(fixed[0], fixed[1])
    torch_rng = _shifts("torch", None)
    assert not torch.equal(torch_rng[0], torch_rng[1])
