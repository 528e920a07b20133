"""Helpers for the Four Cards course, in two halves: the machinery that runs ranks, and the lessons' own libraries.

Everything is imported lazily: each rank of a launch imports this package only for
`report()`, and a rank should not pay for matplotlib or IPython it never uses.

In a notebook, `%load_ext fourcard_helpers` adds the `%%torchrun` cell magic (see magic.py)
and the warm session's `%ranks` / `%%ranks` (see warm_magics.py).

The two halves share one flat folder, and this map is the layout: the saved scripts' `from fourcard_helpers.models
import MnistCNN`, a terminal's `python -m fourcard_helpers.check` and the notebooks' imports name a module directly,
and subfolders would only lengthen those names (tests/unit/test_package_map.py holds this map to the folder).

The machinery that runs ranks (a lesson uses it and never teaches it); one line a module:

    cards.py           which cards a launch runs on: GPUs with NCCL, or simulated cards (CPU processes, gloo)
    preflight.py       can this machine run the course, and on which cards
    launch.py          `torchrun()`: starts a launch as a subprocess of the kernel, streams it, returns its reports
    agent.py           what runs as torchrun: writes down each failed rank's exit, stops when the kernel dies
    worker.py          what runs inside each rank of a launch
    reporting.py       `report()`: what a rank sends back, and tracebacks with portable paths; how a rank ends
    rundir.py          the one contract between ranks and notebook: run-folder files, environment variables, [rankN]
    lifecycle.py       the one way every process is started, found and stopped: the /proc reader, a launch's ranks, the stop
    diagnose.py        the one explanation of a failed launch
    doctor.py          the DDP doctor: the classic data-parallel mistakes in a script that ran
    magic.py           `%%torchrun`, `%%solution` and `%fourcards_lang`, and how a failed launch is shown
    language.py        the learner's language for every message the package gives
    check.py           exercise checks: "not attempted", what is off, or "correct"
    exercises/         build exercises: the learner's file checked on real ranks
    solutions/         the build exercises' reference solutions
    warm_session.py    the warm session on the notebook's side: starts, drives and stops its ranks
    warm_rank_side.py  what runs on each rank of a warm session: a cell, a pull, a push
    warm_engines.py    the warm session's processes: ipyparallel's controller and engines, and how they die
    warm_magics.py     `%ranks` and `%%ranks`
    ranks.py           the warm session's public face (RankSession, RanksMagics); defines nothing
    slurm.py           the practice SLURM cluster's public face and command line (`python -m fourcard_helpers.slurm`)
    slurm_cluster.py   what a practice cluster is: its record, its daemons' mark, its error
    slurm_daemons.py   `up`, `down`, `status`: the cluster's daemons started and stopped
    slurm_conf.py      slurm.conf, gres.conf and the task prolog, each setting with its reason
    slurm_jobids.py    each cluster's block of job ids, claimed machine-wide
    slurm_network.py   each node at an address of its own (`up --own-addresses`, root only)
    slurm_guard.py     `practice_cluster()`: a cluster stopped when its block ends, also if the kernel dies

The lessons' own libraries (what the lessons' code and scripts import):

    data.py            the MNIST digits, read from data/ with no download at run time
    loaders.py         lesson 04's datasets, batch fetching and worker seeding
    models.py          the case-study MNIST CNN
    gpt.py             lesson 13's small GPT and its batches
    moe.py             lesson 14's mixture-of-experts layer and its expert-parallel forward
    ring.py            lesson 14's ring-attention rules and layouts
    schedules.py       pipeline schedules as lists of operations per stage (lesson 07)
    costmodel.py       how long communication takes: the alpha-beta model and published figures
    memory.py          peak memory of some code, on a GPU or a CPU
    plots.py           the figures the lessons share

tests/unit/test_package_map.py holds this map to the package: every module in it exactly once.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "detect": "cards", "Cards": "cards", "CardsError": "cards",
    "torchrun": "launch", "LaunchResult": "launch", "LaunchError": "launch",
    "leftover_processes": "lifecycle", "rank_pids": "lifecycle",
    "report": "reporting", "exit_without_teardown": "reporting",
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
