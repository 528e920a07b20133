"""Helpers for the Four Cards course: cards, launching, data, model, plots, checks.

Everything is imported lazily: each rank of a launch imports this package only for
`report()`, and a rank should not pay for matplotlib or IPython it never uses.

In a notebook, `%load_ext fourcard_helpers` adds the `%%torchrun` cell magic (see magic.py)
and the warm session's `%ranks` / `%%ranks` (see warm_magics.py).
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "detect": "cards", "Cards": "cards", "CardsError": "cards",
    "torchrun": "launch", "LaunchResult": "launch", "LaunchError": "launch",
    "leftover_processes": "launch", "rank_pids": "launch",
    "report": "reporting",
    "load_mnist": "data", "load_mnist_raw": "data", "normalisation": "data",
    "download_full_mnist": "data", "MnistDataError": "data",
    "MnistCNN": "models", "PeakMemory": "memory",
    "RankSession": "warm_session", "RankSessionError": "warm_session",
}
_MODULES = {"cards", "launch", "lifecycle", "rundir", "diagnose", "reporting", "worker", "agent", "data", "loaders",
            "models", "gpt", "moe", "ring", "memory", "schedules", "plots", "check", "costmodel", "magic", "ranks",
            "warm_session", "warm_rank_side", "warm_engines", "warm_magics", "doctor", "preflight", "slurm",
            "slurm_cluster", "slurm_daemons", "slurm_conf", "slurm_jobids", "slurm_network", "slurm_guard"}

__all__ = sorted(_EXPORTS) + sorted(_MODULES) + ["load_ipython_extension"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'fourcard_helpers' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext fourcard_helpers`: register `%%torchrun`, `%ranks` and readable launch errors."""
    from . import plots  # noqa: F401  (a Chinese figure's font, for lessons that draw without plots' helpers)
    from .magic import register

    register(ipython)
