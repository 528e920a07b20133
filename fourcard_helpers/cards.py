"""What the "four cards" of a lesson are on this machine.

Every lesson runs the same code on real GPUs (NCCL) or on simulated cards (CPU processes
talking over gloo). This module makes that one decision, in one place, so a notebook can
state it in its output instead of branching on it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .language import _
from .rundir import DEVICE_ENV, setting, setting_name

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

    def short(self) -> str:
        """The cards in a few words, for a figure's title ("4 simulated cards", "4 × NVIDIA H100"): describe()'s line
        without the backend and the reason, which a title has no room for."""
        if self.kind == "cuda":
            names = sorted(set(self.names))
            return _("{count} × {label}").format(count=self.count, label=names[0] if len(names) == 1 else " / ".join(names))
        return (_("{count} simulated card") if self.count == 1 else _("{count} simulated cards")).format(count=self.count)

    def describe(self) -> str:
        """One line a lesson prints so the learner knows what the cells below ran on."""
        if self.kind == "cuda":
            names = sorted(set(self.names))
            label = names[0] if len(names) == 1 else " / ".join(names)
            return _("{count} × {label} ({backend})").format(count=self.count, label=label, backend=self.backend.upper())
        simulated = (_("{count} simulated card (CPU processes, {backend}) — {reason}") if self.count == 1 else
                     _("{count} simulated cards (CPU processes, {backend}) — {reason}"))
        return simulated.format(count=self.count, backend=self.backend, reason=self.reason)


def requested() -> str:
    """The user's choice from FOURCARDS_DEVICE (auto when unset)."""
    choice = setting(DEVICE_ENV, "auto").lower() or "auto"
    if choice not in CHOICES:
        raise CardsError(_("{setting}={choice} is not understood: use one of {choices} (auto picks GPUs when there "
                           "are enough, else simulated cards).").format(setting=DEVICE_ENV, choice=repr(choice),
                                                                        choices=", ".join(CHOICES)))
    return choice


def detect(nproc: int = 4) -> Cards:
    """Decide what `nproc` ranks run on: real GPUs when at least `nproc` are visible.

    FOURCARDS_DEVICE=cpu forces simulated cards (useful on a one-GPU box: NCCL needs one
    GPU per rank); FOURCARDS_DEVICE=cuda insists on GPUs and fails clearly without them.
    """
    if nproc < 1:
        raise CardsError(_("nproc must be at least 1, got {nproc}.").format(nproc=nproc))
    choice = requested()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = tuple(torch.cuda.get_device_name(i) for i in range(min(gpus, nproc)))
    if choice == "cuda" or (choice == "auto" and gpus >= nproc):
        if gpus == 0:
            raise CardsError(_("{setting}=cuda but no GPU found: unset it (or set {setting}=cpu) to use simulated "
                               "cards, or run on a machine with {nproc} GPUs.").format(setting=DEVICE_ENV, nproc=nproc))
        if gpus < nproc:
            found = _("{nproc} ranks asked for but {gpus} GPU found") if gpus == 1 else _("{nproc} ranks asked for but {gpus} GPUs found")
            raise CardsError((found + _(" (NCCL needs one GPU per rank): pass nproc={gpus} or use simulated cards "
                                        "with {setting}=cpu.")).format(nproc=nproc, gpus=gpus, setting=DEVICE_ENV))
        return Cards("cuda", nproc, "nccl", names, _("GPUs found"))
    if choice == "cpu":
        reason = f"{setting_name(DEVICE_ENV)}=cpu"  # the name the learner set
    elif gpus == 0:
        reason = _("no GPU found")
    else:
        reason = (_("only {gpus} GPU found for {nproc} ranks") if gpus == 1 else
                  _("only {gpus} GPUs found for {nproc} ranks")).format(gpus=gpus, nproc=nproc)
    return Cards("cpu", nproc, "gloo", (), reason)
