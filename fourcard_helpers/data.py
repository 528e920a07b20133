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

from .language import _

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
        return _("run fourcard_helpers.download_full_mnist() (needs the internet), or use full=False")
    return _("restore it with `git checkout -- data/` or rebuild it with `python data/build_mnist_subset.py`")


def read_idx(path: Path) -> torch.Tensor:
    """Read a (gzipped) IDX file: a 4-byte magic (0, 0, type, ndim), the sizes, the data."""
    path = Path(path)
    if not path.is_file():
        raise MnistDataError(_("MNIST file missing: {name} (in {folder}/): {fix}.").format(
            name=path.name, folder=path.parent.name, fix=_fix(path)))
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        zero, kind, ndim = struct.unpack(">HBB", raw[:4])
        shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    except (OSError, EOFError, struct.error, gzip.BadGzipFile) as error:
        raise MnistDataError(_("MNIST file corrupt: {name} ({error}): {fix}.").format(
            name=path.name, error=error, fix=_fix(path))) from error
    body = raw[4 + 4 * ndim :]
    count = 1
    for size in shape:
        count *= size
    if zero != 0 or kind not in IDX_TYPES or len(body) != count:
        raise MnistDataError(_("MNIST file corrupt: {name} (header says {shape}, type {kind}, but holds {size} bytes): "
                               "{fix}.").format(name=path.name, shape=shape, kind=f"{kind:#x}", size=len(body),
                                                fix=_fix(path)))
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
        raise ValueError(_("split must be 'train' or 'test', not {split}").format(split=repr(split)))
    folder = FULL_DIR if full else SUBSET_DIR
    images, labels = (read_idx(folder / name) for name in FILES[split])
    if len(images) != len(labels):
        raise MnistDataError(_("{folder}/: {images} images but {labels} labels: {fix}.").format(
            folder=folder.name, images=len(images), labels=len(labels), fix=_fix(folder / "x")))
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
                errors.append(_("{mirror}: checksum mismatch").format(mirror=mirror))
                continue
            target.write_bytes(payload)
            break
        else:
            raise MnistDataError(_("could not download {name}: {errors}").format(name=name, errors="; ".join(errors)))
    _read_split.cache_clear()
    normalisation.cache_clear()
    return folder
