"""Lesson 04's loader tools: datasets with a known cost per sample, batch fetching, worker seeding.

They live in the package, not in the notebook, because DataLoader workers started with "spawn"
(the default on macOS and Windows) must unpickle the dataset, and a class defined in a notebook
cannot be unpickled in a fresh interpreter. The lesson defines `BatchIndexSampler` and
`seed_worker` in its own cells too; tests/lessons/test_lesson_copies.py keeps the two copies identical.
"""
from __future__ import annotations

import time as _time
from functools import lru_cache

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler, get_worker_info

from .language import _


def _spin(loops: int) -> int:
    """Pure-Python work that holds the GIL the whole time, like decoding or augmenting in Python."""
    total = 0
    for i in range(loops):
        total += i
    return total


@lru_cache(maxsize=1)
def spin_loops_per_us() -> float:
    """How many `_spin` loop turns take one microsecond here (best of several short tries,
    so that a busy machine makes the calibration err on the fast side)."""
    loops, best = 20_000, float("inf")
    for _ in range(7):
        start = _time.perf_counter()
        _spin(loops)
        best = min(best, _time.perf_counter() - start)
    return loops / (best * 1e6)


class SyntheticCostDataset(Dataset):
    """Digit-sized samples (1×28×28 float32, label 0-9) that each cost about `cost_us`
    microseconds to produce: the stand-in for decoding and augmenting real images.

    `kind="cpu"` spends the time in Python code that holds the GIL (decoding, augmenting);
    `kind="io"` spends it sleeping with the GIL released (waiting for a disk or the network).
    The difference is the whole story of threads against processes as loader workers.
    """

    def __init__(self, size: int = 2048, cost_us: float = 0.0, kind: str = "cpu", seed: int = 0) -> None:
        if kind not in ("cpu", "io"):
            raise ValueError(_("kind must be 'cpu' or 'io', not {kind}").format(kind=repr(kind)))
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.rand(size, 1, 28, 28, generator=generator)
        self.labels = torch.randint(0, 10, (size,), generator=generator)
        self.cost_us, self.kind = float(cost_us), kind
        self.loops = round(cost_us * spin_loops_per_us()) if kind == "cpu" else 0  # pickled with the dataset

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kind == "io" and self.cost_us > 0:
            _time.sleep(self.cost_us / 1e6)
        elif self.loops:
            _spin(self.loops)
        return self.images[index], self.labels[index]


class BatchIndexSampler(Sampler):
    """Yields whole batches of indices as tensors, reshuffled every epoch.

    Use it with `DataLoader(dataset, sampler=BatchIndexSampler(...), batch_size=None)` on a
    dataset that can be indexed by a tensor of indices (a TensorDataset can): each batch is
    then one indexing operation instead of `batch_size` calls to `__getitem__` and a stack,
    which is what lets a loader over in-memory tensors run close to the speed of memory.
    """

    def __init__(self, size: int, batch_size: int, shuffle: bool = True, drop_last: bool = False, seed: int = 0) -> None:
        self.size, self.batch_size, self.shuffle, self.drop_last = size, batch_size, shuffle, drop_last
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return self.size // self.batch_size if self.drop_last else -(-self.size // self.batch_size)

    def __iter__(self):
        order = torch.randperm(self.size, generator=self.generator) if self.shuffle else torch.arange(self.size)
        batches = order.split(self.batch_size)
        if self.drop_last and len(batches) and len(batches[-1]) < self.batch_size:
            batches = batches[:-1]
        return iter(batches)


class RandomShiftDataset(Dataset):
    """Images shifted by a random (dy, dx) in [-max_shift, max_shift]: a random augmentation
    whose random numbers are returned with the sample, so a lesson can see who drew what.

    Returns (shifted image, label, shift as int64 tensor [dy, dx]).
    `rng="torch"` draws from torch's global generator, which the DataLoader seeds differently
    in every worker (from the loader's base seed); `rng="numpy"` draws from a
    numpy Generator the dataset creates once, in `__init__`: every worker gets a copy of
    it in the same state, so all workers draw the same shifts unless `seed_worker` reseeds it.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, max_shift: int = 2, rng: str = "torch",
                 seed: int = 0) -> None:
        if rng not in ("torch", "numpy"):
            raise ValueError(_("rng must be 'torch' or 'numpy', not {rng}").format(rng=repr(rng)))
        self.images, self.labels, self.max_shift, self.rng_kind = images, labels, max_shift, rng
        self.rng = np.random.default_rng(seed) if rng == "numpy" else None

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        span = 2 * self.max_shift + 1
        if self.rng is not None:
            shift = torch.from_numpy(self.rng.integers(0, span, size=2)).long() - self.max_shift
        else:
            shift = torch.randint(0, span, (2,)) - self.max_shift
        image = torch.roll(self.images[index], shifts=(int(shift[0]), int(shift[1])), dims=(-2, -1))
        return image, self.labels[index], shift


def seed_worker(worker_id: int) -> None:
    """`worker_init_fn` that gives a dataset's own numpy Generator a seed of its worker's own.

    Inside a worker, `torch.initial_seed()` is the base seed the loader drew from its generator
    when it started its workers, plus the worker id: it differs per worker and (given a per-rank
    loader generator) per rank. Workers that are not persistent start again every epoch with a
    new base seed; persistent workers are seeded once and their generator runs on, so every
    epoch still draws new numbers.
    """
    info = get_worker_info()
    if info is not None and getattr(info.dataset, "rng", None) is not None:
        info.dataset.rng = np.random.default_rng(torch.initial_seed())
