"""What the "four cards" of a lesson are on this machine.

Every lesson runs the same code on real GPUs (NCCL) or on simulated cards (CPU processes
talking over gloo). This module makes that one decision, in one place, so a notebook can
state it in its output instead of branching on it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .rundir import DEVICE_ENV

CHOICES = ("auto", "cpu", "cuda")


class CardsError(RuntimeError):
    """The requested cards cannot be had on this machine."""


@dataclass(frozen=True)
class Cards:
    """The cards a launch of `nproc` ranks will use."""

    kind: str  # "cuda" or "cpu"
    count: int  # ranks that will run, one card each
    backend: str  # "nccl" or "gloo"
    names: tuple[str, ...] = ()  # GPU names; empty for simulated cards
    reason: str = ""  # why this choice was made, for describe()

    def device(self, local_rank: int = 0) -> torch.device:
        """The device that rank `local_rank` on this machine should compute on."""
        if self.kind == "cuda":
            return torch.device("cuda", local_rank)
        return torch.device("cpu")

    def describe(self) -> str:
        """One line a lesson prints so the learner knows what the cells below ran on."""
        if self.kind == "cuda":
            names = sorted(set(self.names))
            label = names[0] if len(names) == 1 else " / ".join(names)
            return f"{self.count} × {label} ({self.backend.upper()})"
        plural = "card" if self.count == 1 else "cards"
        return f"{self.count} simulated {plural} (CPU processes, {self.backend}) — {self.reason}"


def requested() -> str:
    """The user's choice from FOURCARD_DEVICE (auto when unset)."""
    choice = os.environ.get(DEVICE_ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise CardsError(
            f"{DEVICE_ENV}={choice!r} is not understood: use one of {', '.join(CHOICES)} "
            f"(auto picks GPUs when there are enough, else simulated cards)."
        )
    return choice


def detect(nproc: int = 4) -> Cards:
    """Decide what `nproc` ranks run on: real GPUs when at least `nproc` are visible.

    FOURCARD_DEVICE=cpu forces simulated cards (useful on a one-GPU box: NCCL needs one
    GPU per rank); FOURCARD_DEVICE=cuda insists on GPUs and fails clearly without them.
    """
    if nproc < 1:
        raise CardsError(f"nproc must be at least 1, got {nproc}.")
    choice = requested()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = tuple(torch.cuda.get_device_name(i) for i in range(min(gpus, nproc)))
    if choice == "cuda" or (choice == "auto" and gpus >= nproc):
        if gpus == 0:
            raise CardsError(
                f"{DEVICE_ENV}=cuda but no GPU found: unset it (or set {DEVICE_ENV}=cpu) to use "
                f"simulated cards, or run on a machine with {nproc} GPUs."
            )
        if gpus < nproc:
            raise CardsError(
                f"{nproc} ranks asked for but {gpus} GPU{'s' if gpus > 1 else ''} found "
                f"(NCCL needs one GPU per rank): pass nproc={gpus} or use simulated cards "
                f"with {DEVICE_ENV}=cpu."
            )
        return Cards("cuda", nproc, "nccl", names, "GPUs found")
    if choice == "cpu":
        reason = f"{DEVICE_ENV}=cpu"
    elif gpus == 0:
        reason = "no GPU found"
    else:
        reason = f"only {gpus} GPU{'s' if gpus > 1 else ''} found for {nproc} ranks"
    return Cards("cpu", nproc, "gloo", (), reason)
