"""The shipped MNIST subset, its reader, and the optional full-set download's parser."""
from __future__ import annotations

import gzip
import struct
import sys
from pathlib import Path

import pytest
import torch

from fourcard_helpers import data
from fourcard_helpers.data import MnistDataError, load_mnist, load_mnist_raw, normalisation, read_idx
from fourcard_helpers.rundir import MNIST_FULL_ENV, RENAMED
from helpers import ROOT


def test_shipped_subset_is_real_balanced_and_split() -> None:
    train_x, train_y = load_mnist_raw("train")
    test_x, test_y = load_mnist_raw("test")
    assert train_x.shape == (4000, 28, 28) and test_x.shape == (1000, 28, 28)
    assert train_x.dtype == torch.uint8 and train_y.dtype == torch.int64
    assert torch.bincount(train_y).tolist() == [400] * 10
    assert torch.bincount(test_y).tolist() == [100] * 10
    flat_train = {bytes(img.numpy()) for img in train_x}
    assert not any(bytes(img.numpy()) in flat_train for img in test_x)  # no digit in both splits
    assert train_y[:20].unique().numel() > 5  # shuffled, not sorted by digit


def test_callers_cannot_corrupt_what_later_loads_read() -> None:
    mean, std = normalisation()
    images, labels = load_mnist_raw("train")
    first_label = labels[0].item()
    images.zero_()  # an in-place edit by one caller...
    labels.fill_(-1)
    load_mnist("train").tensors[1].fill_(-1)
    again_images, again_labels = load_mnist_raw("train")  # ...is not what the next caller gets
    assert again_images.float().mean() > 0 and again_labels[0].item() == first_label
    assert load_mnist("train").tensors[1][0].item() == first_label
    normalisation.cache_clear()
    assert normalisation() == (mean, std)


def test_normalisation_is_computed_from_training_pixels() -> None:
    mean, std = normalisation()
    pixels = load_mnist_raw("train")[0].double() / 255
    assert mean == pytest.approx(pixels.mean().item()) and std == pytest.approx(pixels.std().item())
    assert 0.12 < mean < 0.14 and 0.29 < std < 0.32  # what MNIST's pixels are known to give
    images, labels = load_mnist("train").tensors
    assert images.shape == (4000, 1, 28, 28) and images.dtype == torch.float32
    assert abs(images.mean().item()) < 1e-4 and images.std().item() == pytest.approx(1.0, abs=1e-4)
    raw01 = load_mnist("test", normalize=False).tensors[0]
    assert raw01.min() == 0 and raw01.max() == 1


def write_idx(path: Path, array: torch.Tensor) -> None:
    header = struct.pack(">HBB", 0, 8, array.dim()) + struct.pack(f">{array.dim()}I", *array.shape)
    path.write_bytes(gzip.compress(header + array.numpy().tobytes()))


def test_idx_reader_on_files_written_here(tmp_path: Path) -> None:
    images = torch.randint(0, 256, (3, 28, 28), dtype=torch.uint8)
    labels = torch.tensor([7, 0, 9], dtype=torch.uint8)
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", images)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", labels)
    assert torch.equal(read_idx(tmp_path / "train-images-idx3-ubyte.gz"), images)
    assert torch.equal(read_idx(tmp_path / "train-labels-idx1-ubyte.gz"), labels)


def test_full_set_is_read_from_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for split, (image_name, label_name) in data.FILES.items():
        write_idx(tmp_path / image_name, torch.zeros(6, 28, 28, dtype=torch.uint8))
        write_idx(tmp_path / label_name, torch.arange(6, dtype=torch.uint8))
    monkeypatch.setattr(data, "FULL_DIR", tmp_path)
    data._read_split.cache_clear()
    try:
        images, labels = load_mnist_raw("test", full=True)
        assert images.shape == (6, 28, 28) and labels.tolist() == list(range(6))
    finally:
        data._read_split.cache_clear()


def test_missing_file_names_it_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(MnistDataError, match=r"missing: nothing\.gz.*git checkout -- data/"):
        read_idx(tmp_path / "nothing.gz")


def test_corrupt_files_name_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(MnistDataError, match=r"corrupt: bad\.gz"):
        read_idx(bad)
    short = tmp_path / "short-idx3-ubyte.gz"
    short.write_bytes(gzip.compress(struct.pack(">HBB3I", 0, 8, 3, 10, 28, 28) + b"\0" * 100))
    with pytest.raises(MnistDataError, match=r"header says \(10, 28, 28\).*holds 100 bytes"):
        read_idx(short)


class FakeResponse:
    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def read(self) -> bytes:
        return self.payload

    def __enter__(self) -> "FakeResponse":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def test_download_checks_each_file_and_tries_the_next_mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No network: urlopen is replaced by a fake that serves bytes, one mirror being broken."""
    import hashlib

    payloads = {name: gzip.compress(name.encode()) for name in data.FULL_MD5}
    monkeypatch.setattr(data, "FULL_MD5", {name: hashlib.md5(p).hexdigest() for name, p in payloads.items()})
    asked = []

    def fake_urlopen(url: str, timeout: float) -> FakeResponse:
        asked.append(url)
        mirror, name = url.rsplit("/", 1)
        if mirror + "/" == data.MIRRORS[0]:
            return FakeResponse(b"a mirror serving garbage")  # fails its checksum
        return FakeResponse(payloads[name])

    monkeypatch.setattr(data.urllib.request, "urlopen", fake_urlopen)
    folder = data.download_full_mnist(tmp_path / "full")
    assert sorted(p.name for p in folder.iterdir()) == sorted(payloads)
    assert all((folder / name).read_bytes() == payload for name, payload in payloads.items())
    assert len(asked) == 2 * len(payloads)
    asked.clear()
    data.download_full_mnist(tmp_path / "full")  # already there and intact: nothing fetched
    assert asked == []
    monkeypatch.setattr(data, "MIRRORS", data.MIRRORS[:1])
    with pytest.raises(MnistDataError, match="checksum mismatch"):
        data.download_full_mnist(tmp_path / "other")


def test_the_recipes_validation_split_is_held_out_of_training_and_never_the_test_digits(monkeypatch) -> None:
    """Lesson 11 chooses the recipe's learning rate on this split: its digits must be training digits that the
    choosing runs do not train on, and none of them a test digit."""
    for name in (MNIST_FULL_ENV, RENAMED[MNIST_FULL_ENV]):  # the module reads it on import: the shipped digits here
        monkeypatch.delenv(name, raising=False)
    monkeypatch.syspath_prepend(str(ROOT / "notebooks"))
    monkeypatch.delitem(sys.modules, "mnist_recipe", raising=False)
    import mnist_recipe
    train, held_out = mnist_recipe.build_datasets_held_out()
    images = load_mnist("train").tensors[0]
    trained_on, judged_on = train.data.indices, held_out.indices
    assert (len(trained_on), len(judged_on)) == (3500, 500)
    assert sorted(trained_on + judged_on) == list(range(len(images)))  # every training digit once, in one side only
    test_images = {bytes(img.numpy()) for img in load_mnist("test").tensors[0]}
    assert not any(bytes(held_out[k][0].numpy()) in test_images for k in range(len(held_out)))
