"""The MNIST digits of the course, read from `data/` with no download at run time.

The repository ships 5,000 real MNIST digits (4,000 train, 1,000 test; see data/README.md)
as gzipped IDX files, the format of the original MNIST distribution. `download_full_mnist()`
fetches the full 60,000/10,000 set into data/mnist_full/ for learners who are online; the
same reader then serves it with `full=True`.
"""
from __future__ import annotations

import gzip
import hashlib
import struct
import urllib.request
from functools import lru_cache
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
SUBSET_DIR = DATA_DIR / "mnist_5k"
FULL_DIR = DATA_DIR / "mnist_full"
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
# The full set: mirrors tried in order, and the MD5 sums published with the original files.
MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "https://yann.lecun.com/exdb/mnist/")
FULL_MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
IDX_TYPES = {0x08: torch.uint8}  # MNIST uses unsigned bytes only


class MnistDataError(RuntimeError):
    """A data file is missing or unreadable; the message names the file and the fix."""


def _fix(path: Path) -> str:
    if path.parent == FULL_DIR:
        return "run fourcard_helpers.download_full_mnist() (needs the internet), or use full=False"
    return "restore it with `git checkout -- data/` or rebuild it with `python data/build_mnist_subset.py`"


def read_idx(path: Path) -> torch.Tensor:
    """Read a (gzipped) IDX file: a 4-byte magic (0, 0, type, ndim), the sizes, the data."""
    path = Path(path)
    if not path.is_file():
        raise MnistDataError(f"MNIST file missing: {path.name} (in {path.parent.name}/): {_fix(path)}.")
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        zero, kind, ndim = struct.unpack(">HBB", raw[:4])
        shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    except (OSError, EOFError, struct.error, gzip.BadGzipFile) as error:
        raise MnistDataError(f"MNIST file corrupt: {path.name} ({error}): {_fix(path)}.") from error
    body = raw[4 + 4 * ndim :]
    count = 1
    for size in shape:
        count *= size
    if zero != 0 or kind not in IDX_TYPES or len(body) != count:
        raise MnistDataError(
            f"MNIST file corrupt: {path.name} (header says {shape}, type {kind:#x}, "
            f"but holds {len(body)} bytes): {_fix(path)}."
        )
    return torch.frombuffer(bytearray(body), dtype=IDX_TYPES[kind]).reshape(shape)


def load_mnist_raw(split: str = "train", full: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixels as stored (uint8, 0-255, shape N×28×28) and labels (int64, shape N).

    The caller's own copies: editing them in place cannot change what a later call (or
    `normalisation()`) reads.
    """
    images, labels = _read_split(split, full)
    return images.clone(), labels.clone()


@lru_cache(maxsize=4)
def _read_split(split: str, full: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The files of one split, read once per process; never handed out (see load_mnist_raw)."""
    if split not in FILES:
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    folder = FULL_DIR if full else SUBSET_DIR
    images, labels = (read_idx(folder / name) for name in FILES[split])
    if len(images) != len(labels):
        raise MnistDataError(f"{folder.name}/: {len(images)} images but {len(labels)} labels: {_fix(folder / 'x')}.")
    return images, labels.long()


@lru_cache(maxsize=2)
def normalisation(full: bool = False) -> tuple[float, float]:
    """Mean and standard deviation of the training pixels, scaled to 0-1.

    Computed from the training split only: the test set must not leak into preprocessing.
    """
    pixels = _read_split("train", full)[0].double() / 255
    return pixels.mean().item(), pixels.std().item()


def load_mnist(split: str = "train", full: bool = False, normalize: bool = True) -> TensorDataset:
    """MNIST as a TensorDataset of (images N×1×28×28 float32, labels int64).

    With `normalize` the pixels are standardised with the training set's mean and standard
    deviation; without it they are scaled to 0-1.
    """
    images, labels = _read_split(split, full)
    x = images.float().div(255).unsqueeze(1)  # a new tensor: the cached pixels stay as read
    if normalize:
        mean, std = normalisation(full)
        x = (x - mean) / std
    return TensorDataset(x, labels.clone())


def download_full_mnist(folder: Path = FULL_DIR) -> Path:
    """Fetch the full MNIST set (60,000 train, 10,000 test; about 11 MB) into `folder`.

    Optional and explicit: the course runs on the shipped subset, and nothing calls this
    for you. Files already present with the right checksum are kept.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, md5 in FULL_MD5.items():
        target = folder / name
        if target.is_file() and hashlib.md5(target.read_bytes()).hexdigest() == md5:
            continue
        errors = []
        for mirror in MIRRORS:
            try:
                with urllib.request.urlopen(mirror + name, timeout=60) as response:
                    payload = response.read()
            except OSError as error:
                errors.append(f"{mirror}: {error}")
                continue
            if hashlib.md5(payload).hexdigest() != md5:
                errors.append(f"{mirror}: checksum mismatch")
                continue
            target.write_bytes(payload)
            break
        else:
            raise MnistDataError(f"could not download {name}: " + "; ".join(errors))
    _read_split.cache_clear()
    normalisation.cache_clear()
    return folder


# --- Lesson 04 (data loading): datasets with a known cost, batch fetching, worker seeding ---
# They live here, not in the notebook, because DataLoader workers started with "spawn" (the
# default on macOS and Windows) must unpickle the dataset, and a class defined in a notebook
# cannot be unpickled in a fresh interpreter.

import time as _time  # noqa: E402

import numpy as np  # noqa: E402
from torch.utils.data import Dataset, Sampler, get_worker_info  # noqa: E402


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
            raise ValueError(f"kind must be 'cpu' or 'io', not {kind!r}")
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
            raise ValueError(f"rng must be 'torch' or 'numpy', not {rng!r}")
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
