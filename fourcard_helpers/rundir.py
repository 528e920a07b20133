"""The run folder and the course's environment variables: the one contract between the notebook and
what it starts (a launch's ranks, a warm session, the practice SLURM cluster).

Every launch gets a fresh folder, named to the ranks by the environment variable RUN_DIR_ENV.
Each rank (and the torchrun agent, for what only it knows) leaves one file per record kind,
named `<kind>.<global rank>`:

    pid.R     the rank's process id, so the launcher can stop a rank torchrun lost track of,
              and `rank_pids()` can name each rank's process
    stdout.R  the rank's standard output and error, as it prints them
    stderr.R
    report.R  one JSON object per `report()` call (read by `ReportReader` alone)
    error.R   the Python exception (or non-zero sys.exit) that ended the rank: an `error_record` (reporting.py)
    crash.R   faulthandler's stack when the rank died in native code (SIGSEGV, SIGABRT, ...)
    done.R    the rank's script returned normally
    exit.R    how the rank's process ended, as the torchrun agent saw it (JSON; failures only)
    doctor.R  what the DDP doctor saw the rank's script do (JSON; see doctor.py)
    trace.R   an exercise check's folder: the collectives the rank launched, one JSON line each
    stuck.R   an exercise check's folder: what the rank waited for when its time limit passed (JSON)

and, beside the records, the files of the launch as a whole (FILES):

    cell.py          a cell's source, when the launch was given source rather than a file
    torchrun/N/      torchrun's own logs of node N (its --log-dir)
    profile/         a warm session: ipyparallel's profile (connection files)
    ipython/         a warm session: the engines' IPYTHONDIR
    controller.log   a warm session: the ipyparallel controller's output
    torchrun.log     a warm session: torchrun's output

Global ranks, not local ones, name the files, so several agents (one per node) can share a
folder. A new kind of record is a new name in KINDS and a call to `write`/`append`/`read_*`.
Records are written atomically (a reader never sees half of one), except the append-only
ones (`report`, the output streams), which a reader takes line by line.

Every environment variable the course reads or sets is named here, and only here, under one prefix,
FOURCARDS_. The names it used before (FOURCARD_DEVICE, ...) are still read for a while (`setting`),
with a one-line notice of the new name.

Standard library only: every rank imports this before the lesson's script starts.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

PREFIX = "FOURCARDS_"
# The course's own variables, through which the notebook speaks to what it starts and a learner to the course.
RUN_DIR_ENV = PREFIX + "RUN_DIR"  # where this launch's records go
LABEL_ENV = PREFIX + "SCRIPT_LABEL"  # the name tracebacks show for the script
DOCTOR_ENV = PREFIX + "DOCTOR"  # "0": ranks do not watch the script for data-parallel mistakes
DEVICE_ENV = PREFIX + "DEVICE"  # the learner's choice of cards (cards.py); a launch passes the kernel's on
LANG_ENV = PREFIX + "LANG"  # the learner's language (language.py); a launch passes the notebook's on
LAUNCHER_ENV = PREFIX + "LAUNCHER_PID"  # in every process a notebook starts: the kernel's pid (lifecycle.py)
WATCH_FD_ENV = PREFIX + "WATCH_FD"  # a tree's root: the read end of the kernel's pipe (lifecycle.py)
SESSION_ENV = PREFIX + "RANKS_SESSION"  # in every process of one warm session (warm_session.py)
SLURM_ENV = PREFIX + "SLURM"  # every daemon of a practice SLURM cluster: the cluster's folder (slurm_daemons.py)
VENV_ENV = PREFIX + "VENV"  # the Python environment lesson 12's batch file activates on every node
FULL_ENV = PREFIX + "FULL"  # "1": lessons 10, 11 and 13 run their long measurements instead of reading them
MNIST_FULL_ENV = PREFIX + "MNIST_FULL"  # "1": lesson 11's recipe (notebooks/mnist_recipe.py) trains on the full MNIST
# Their names before the one prefix, still read (see `setting`).
RENAMED = {RUN_DIR_ENV: "FOURCARD_RUN_DIR", LABEL_ENV: "FOURCARD_SCRIPT_LABEL", DOCTOR_ENV: "FOURCARD_DOCTOR",
           DEVICE_ENV: "FOURCARD_DEVICE", MNIST_FULL_ENV: "MNIST_FULL"}

# Other programs' variables the course sets for what it starts, or reads.
RANK_ENV, LOCAL_RANK_ENV, WORLD_SIZE_ENV = "RANK", "LOCAL_RANK", "WORLD_SIZE"  # torchrun's, in every rank
# torchrun's agent shares its rendezvous TCP store with the ranks; after an elastic restart, gloo launches here
# did not all come back with it (benchmarks/restart_store.py; for NCCL see pytorch/pytorch#135712). With this
# set, each round of the rendezvous gives the ranks a store of their own.
OWN_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
# init_process_group is not a meeting on gloo: a rank whose connections are made may run on and exit while a
# slower one still connects to it, which then fails ("Gloo connectFullMesh failed ... Connection closed by
# peer"). PyTorch's own switch makes init end with a barrier on the rendezvous store, which outlives the ranks.
INIT_BARRIER_ENV = "TORCH_DIST_INIT_BARRIER"
THREADS_ENV, UNBUFFERED_ENV, MPL_BACKEND_ENV = "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "MPLBACKEND"
GLOO_INTERFACE_ENV, VISIBLE_GPUS_ENV, PYTHONPATH_ENV = "GLOO_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES", "PYTHONPATH"
IPYTHONDIR_ENV = "IPYTHONDIR"  # a warm session's engines
SLURM_CONF_ENV = "SLURM_CONF"  # which practice cluster SLURM's commands speak to
PATH_ENV = "PATH"  # where programs are found: SLURM's daemons live in sbin, which an ordinary user's may lack

PID, STDOUT, STDERR, REPORT, ERROR, CRASH, DONE, EXIT, DOCTOR, TRACE, STUCK = (
    "pid", "stdout", "stderr", "report", "error", "crash", "done", "exit", "doctor", "trace", "stuck")
KINDS = (PID, STDOUT, STDERR, REPORT, ERROR, CRASH, DONE, EXIT, DOCTOR, TRACE, STUCK)
CELL, TORCHRUN_LOGS, PROFILE, IPYTHON, CONTROLLER_LOG, TORCHRUN_LOG = (
    "cell.py", "torchrun", "profile", "ipython", "controller.log", "torchrun.log")
FILES = (CELL, TORCHRUN_LOGS, PROFILE, IPYTHON, CONTROLLER_LOG, TORCHRUN_LOG)

_noticed: set[str] = set()


def setting(name: str, default: str = "") -> str:
    """The course's variable `name` (one of the names above) as this process has it, stripped; where only
    its old name is set, that one's value, with a one-line notice (once a process) to use the new name."""
    if name in os.environ:
        return os.environ[name].strip()
    old = RENAMED.get(name)
    if old is None or old not in os.environ:
        return default
    if old not in _noticed:
        from .language import _  # here, not above: language.py takes its own variable's name from this module

        _noticed.add(old)
        print(_("fourcards: {old} still works for now, but its name is now {new}: set {new} instead.").format(
            old=old, new=name), file=sys.stderr, flush=True)
    return os.environ[old].strip()


def setting_name(name: str) -> str:
    """The name under which `name` is set in this process: the new one, or the old one where only it is."""
    old = RENAMED.get(name)
    return old if name not in os.environ and old is not None and old in os.environ else name


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
        path = setting(RUN_DIR_ENV)
        return cls(path) if path else None

    def file(self, kind: str, rank: int) -> Path:
        """Where rank `rank` keeps its record of `kind`."""
        if kind not in KINDS:
            raise ValueError(f"unknown record kind {kind!r}; known: {', '.join(KINDS)}")
        return self.path / f"{kind}.{rank}"

    def part(self, name: str) -> Path:
        """Where the launch keeps its file (or folder) `name`, one of FILES."""
        if name not in FILES:
            raise ValueError(f"unknown record kind {name!r}; known: {', '.join(FILES)}")
        return self.path / name

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

    def pids(self) -> dict[int, int]:
        """Rank -> the process id it recorded (the latest attempt's, after an elastic restart). A pid
        may have ended, or been given to another process since: lifecycle.carries tells."""
        found = {}
        for rank, text in self.read_text(PID).items():
            try:
                found[rank] = int(text)
            except ValueError:
                continue  # being written
        return found


class ReportReader:
    """The one reader of `report` records, for a launch (once, at its end) and a warm session (after
    every cell): what each rank passed to `report()`, a later value of a name replacing the earlier one."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self.values: dict[int, dict[str, Any]] = {}
        self._taken: dict[int, int] = {}  # rank -> lines already taken

    def take(self) -> list[tuple[int, str]]:
        """Take every complete line written since the last call: (rank, line), in rank order."""
        new = []
        for rank, text in self.run.read_text(REPORT).items():
            lines = text.splitlines(True)
            complete = [line for line in lines[self._taken.get(rank, 0):] if line.endswith("\n")]
            self._taken[rank] = self._taken.get(rank, 0) + len(complete)
            for line in complete:
                self.values.setdefault(rank, {}).update(json.loads(line))
                new.append((rank, line.rstrip("\n")))
        return new
