"""How long each lesson takes top to bottom in a fresh kernel, as a learner's "Run All".

The instructor guide's schedule is built from these figures. Each notebook runs on a copy (the
stored notebooks are not touched), one after another on an otherwise quiet machine.

    python benchmarks/notebook_times.py [NN ...]     # all lessons, or the numbered ones
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent


def main(numbers: list[str]) -> None:
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if numbers:
        notebooks = [path for path in notebooks if path.name[:2] in numbers]
    print(f"{os.cpu_count()} cores; one fresh kernel per notebook")
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "notebooks"
        shutil.copytree(ROOT / "notebooks", copy)
        total = 0.0
        for path in notebooks:
            notebook = nbformat.read(copy / path.name, as_version=4)
            started = time.perf_counter()
            NotebookClient(notebook, timeout=900, resources={"metadata": {"path": str(copy)}}).execute()
            seconds = time.perf_counter() - started
            total += seconds
            print(f"{path.stem:40s} {seconds:6.1f} s", flush=True)
        print(f"{'all':40s} {total:6.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
