"""A practice cluster for a `with` block, and the guard that stops it if the kernel dies inside the block.

The guard is `python -m fourcard_helpers.slurm guard`, started before `up`: it holds the read end of a
pipe whose write end only the kernel holds, and runs `down` when that pipe closes, however the kernel died.
"""
from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .lifecycle import KernelPipe, wait_for_kernel_death
from .slurm_cluster import Cluster
from .slurm_daemons import down, up


@contextmanager
def practice_cluster(nodes: int = 2, folder: Path | None = None, own_addresses: bool = False) -> Iterator[Cluster]:
    """A practice cluster for a `with` block, stopped when the block ends, also if the kernel dies in it.

    A guard process holds the read end of a pipe whose write end only this process holds
    (lifecycle.KernelPipe): if this process dies, however it dies, even while `up` is still starting the
    daemons, the guard runs `down`, which finds each daemon in the folder's record as soon as it exists."""
    folder = Path(folder).expanduser().resolve() if folder is not None else Path(tempfile.mkdtemp(prefix="fourcards-slurm-"))
    folder.mkdir(parents=True, exist_ok=True)
    pipe = KernelPipe()
    with open(folder / "guard.log", "ab") as log:
        guard = pipe.start([sys.executable, "-m", "fourcard_helpers.slurm", "guard", "--dir", str(folder)],
                           dict(os.environ), log)
    pipe.started()
    try:
        cluster = up(nodes, folder, own_addresses=own_addresses)
        yield cluster
    finally:
        down(folder)
        pipe.close()
        guard.wait()


def run_guard(folder: Path) -> None:
    """Wait for the kernel's pipe to close, then stop the cluster (already stopped: nothing to do)."""
    wait_for_kernel_death()
    down(folder)
