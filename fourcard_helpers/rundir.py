"""The run folder: the one contract between a launch's ranks and the notebook that started them.

Every launch gets a fresh folder, named to the ranks by the environment variable RUN_DIR_ENV.
Each rank (and the torchrun agent, for what only it knows) leaves one file per record kind,
named `<kind>.<global rank>`:

    pid.R     the rank's process id, so the launcher can stop a rank torchrun lost track of
    stdout.R  the rank's standard output and error, as it prints them
    stderr.R
    report.R  one JSON object per `report()` call
    error.R   the Python exception (or non-zero sys.exit) that ended the rank, as JSON
    crash.R   faulthandler's stack when the rank died in native code (SIGSEGV, SIGABRT, ...)
    done.R    the rank's script returned normally
    exit.R    how the rank's process ended, as the torchrun agent saw it (JSON; failures only)
    doctor.R  what the DDP doctor saw the rank's script do (JSON; see doctor.py)

Global ranks, not local ones, name the files, so several agents (one per node) can share a
folder. A new kind of record is a new name in KINDS and a call to `write`/`append`/`read_*`.
Records are written atomically (a reader never sees half of one), except the append-only
ones (`report`, the output streams), which a reader takes line by line.

Standard library only: every rank imports this before the lesson's script starts.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# The course's own environment variables (FOURCARD_*), through which the notebook speaks to what it
# starts: every one the package reads or sets is named here, and only here.
RUN_DIR_ENV = "FOURCARD_RUN_DIR"  # where this launch's records go
LABEL_ENV = "FOURCARD_SCRIPT_LABEL"  # the name tracebacks show for the script
DOCTOR_ENV = "FOURCARD_DOCTOR"  # "0": ranks do not watch the script for data-parallel mistakes
DEVICE_ENV = "FOURCARD_DEVICE"  # the learner's choice of cards (cards.py); a launch passes the kernel's on
LAUNCHER_ENV = "FOURCARD_LAUNCHER_PID"  # in every process a notebook starts: the kernel's pid (lifecycle.py)
WATCH_FD_ENV = "FOURCARD_WATCH_FD"  # a tree's root: the read end of the kernel's pipe (lifecycle.py)
SESSION_ENV = "FOURCARD_RANKS_SESSION"  # in every process of one warm session (ranks.py)

PID, STDOUT, STDERR, REPORT, ERROR, CRASH, DONE, EXIT, DOCTOR = (
    "pid", "stdout", "stderr", "report", "error", "crash", "done", "exit", "doctor")
KINDS = (PID, STDOUT, STDERR, REPORT, ERROR, CRASH, DONE, EXIT, DOCTOR)


def rank_prefix(rank: int) -> str:
    """How the notebook marks a line of rank `rank`'s output: `[rank2] loss 0.31`."""
    return f"[rank{rank}] "


class RunDir:
    """One launch's folder of per-rank records."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @classmethod
    def from_env(cls) -> RunDir | None:
        """The folder of the launch this process belongs to; None outside the launcher."""
        path = os.environ.get(RUN_DIR_ENV)
        return cls(path) if path else None

    def file(self, kind: str, rank: int) -> Path:
        """Where rank `rank` keeps its record of `kind`."""
        if kind not in KINDS:
            raise ValueError(f"unknown record kind {kind!r}; known: {', '.join(KINDS)}")
        return self.path / f"{kind}.{rank}"

    # -- writing (ranks and agent) ---------------------------------------------------------
    def write(self, kind: str, rank: int, text: str) -> None:
        """Write a whole record at once: readers see the old state or the new, never half."""
        target = self.file(kind, rank)
        partial = target.with_name(target.name + ".partial")  # not `<kind>.<digits>`: never read
        partial.write_text(text, encoding="utf-8")
        partial.replace(target)

    def write_json(self, kind: str, rank: int, data: Any) -> None:
        self.write(kind, rank, json.dumps(data))

    def append_json(self, kind: str, rank: int, data: Any) -> None:
        """Add one JSON line to an append-only record (one write call, so lines never mix)."""
        with open(self.file(kind, rank), "a", encoding="utf-8") as out:
            out.write(json.dumps(data) + "\n")

    # -- reading (launcher and diagnosis) ----------------------------------------------------
    def ranks(self, kind: str) -> dict[int, Path]:
        """Rank → file, for every rank that has a record of `kind`."""
        found = {}
        for path in self.path.glob(f"{kind}.*"):
            suffix = path.name[len(kind) + 1:]
            if suffix.isdigit():
                found[int(suffix)] = path
        return dict(sorted(found.items()))

    def read_text(self, kind: str) -> dict[int, str]:
        return {rank: path.read_text(encoding="utf-8", errors="replace") for rank, path in self.ranks(kind).items()}

    def read_json(self, kind: str) -> dict[int, Any]:
        return {rank: json.loads(text) for rank, text in self.read_text(kind).items()}

    def read_json_lines(self, kind: str) -> dict[int, list[Any]]:
        return {rank: [json.loads(line) for line in text.splitlines() if line.strip()]
                for rank, text in self.read_text(kind).items()}
