"""Why a launch failed, in one function: `diagnose(run folder, ranks' output, torchrun's ending)`.

It reads only structured records (see rundir.py): the ranks' own error and crash files, and
the exit code or signal of each failed rank as torchrun's agent recorded it. torchrun's printed
summary is shown to the learner only when nothing else is known (torchrun itself failed), never
parsed. Being a pure function of a folder and two strings, every failure kind is tested in
milliseconds from a fixture folder (tests/unit/test_diagnose.py).

The first failing rank is the one to blame: when one rank dies, the others fail soon after
("connection closed by peer", ...), and their errors only follow from the first.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .language import N_, _, sentences
from .reporting import shorten_paths
from .rundir import CRASH, DONE, ERROR, EXIT, RunDir, rank_prefix


class LaunchError(RuntimeError):
    """A launch failed. `rank` is the first rank that failed (None when none could be named)."""

    def __init__(self, message: str, rank: int | None = None, log: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.log = log


@dataclass(frozen=True)
class Ending:
    """How the launcher saw torchrun end."""

    returncode: int | None  # torchrun's exit status; None when the launcher had to stop it
    output: str = ""  # torchrun's own messages
    timeout: float | None = None  # set when the launch ran past this many seconds


SIGNAL_HINTS = {  # translated where they are used
    "SIGABRT": N_(
        "SIGABRT means the C++ runtime gave up; the rank's last output usually says why. A rank that "
        "finished its script and aborted while its process ended ('terminate called without an active "
        "exception') met gloo's exit race: one of gloo's threads was still handing back the last "
        "collective when Python shut down (lesson 00, \"How a rank ends\"). End the script with "
        "dist.destroy_process_group(), then exit_without_teardown() (from fourcard_helpers)."
    ),
    "SIGKILL": N_("SIGKILL from outside usually means the machine ran out of memory."),
    "SIGSEGV": N_("SIGSEGV is a crash inside native code; the rank's log above may say where."),
}

CARDS_FIX = N_(
    "write the script for whichever cards the launch has: `cards = detect(int(os.environ[\"WORLD_SIZE\"]))`, "
    "`dist.init_process_group(cards.backend)`, and put the model and tensors on "
    "`cards.device(local_rank)` (with `local_rank = int(os.environ[\"LOCAL_RANK\"])`); "
    "or run it on a machine with four GPUs."
)

# (pattern in the failing rank's "Type: message", only on simulated cards?, hint). Each pattern
# is the text PyTorch really prints for the cause (see tests/unit/test_diagnose.py).
HINTS: tuple[tuple[str, bool, str], ...] = (
    (r"doesn't have NCCL built in|NCCL|Duplicate GPU detected", True,
     N_("The script asks for NCCL, the GPU backend, but this launch runs on simulated cards (CPU "
        "processes, which talk over gloo): {fix}")),
    (r"Torch not compiled with CUDA enabled|_cuda_setDevice|no NVIDIA driver|invalid device ordinal"
     r"|No CUDA GPUs are available|CUDA driver", True,
     N_("The script asks for a GPU (torch.cuda.set_device, .cuda(), .to(\"cuda:N\")), but this launch "
        "runs on simulated cards (CPU processes): {fix}")),
    (r"EADDRINUSE|address already in use", False,
     N_("A port the script asked for is already in use, often by a launch still running (see "
        "leftover_processes()) or a second copy of this one. Under torchrun, let torchrun choose: "
        "call dist.init_process_group(cards.backend) without init_method, and do not set "
        "MASTER_PORT in the script.")),
    (r"Default process group has not been initialized", False,
     N_("This rank used torch.distributed before joining the group: call "
        "dist.init_process_group(cards.backend) on every rank, before any collective, "
        "get_rank() or DistributedDataParallel.")),
    (r"^EOFError: EOF when reading a line", False,
     N_("A rank has no keyboard: input() and reads of sys.stdin get nothing under a launcher. Pass "
        "the value as an argument to the script (after `--` on the %%torchrun line) or set it in the script.")),
    (r"can't allocate memory|out of memory|OutOfMemoryError", False,
     N_("The rank ran out of memory. Every rank holds its own model, optimizer state and batch (and "
        "simulated cards all share one machine's memory): use a smaller batch or model, or fewer ranks.")),
)


def hint_for(text: str, simulated: bool) -> str:
    """The advice for a failing rank's error text ('' when no known cause matches)."""
    for pattern, simulated_only, hint in HINTS:
        if (simulated or not simulated_only) and re.search(pattern, text):
            return _(hint).format(fix=_(CARDS_FIX))
    return ""


def signal_hint(name: str | None) -> str:
    """What a signal that ended a rank usually means ('' for one without advice)."""
    return _(SIGNAL_HINTS[name]) if name in SIGNAL_HINTS else ""


def last_output(tail: str) -> str:
    return _("Its last output:\n{tail}").format(tail=tail) if tail else ""


def rank_tail(log: str, rank: int, lines: int = 8) -> str:
    """The last `lines` lines rank `rank` printed, from the launch's prefixed output."""
    mine = [line for line in log.splitlines(True) if line.startswith(rank_prefix(rank))]
    return "".join(mine[-lines:])


def _followed(rank: int) -> str:
    return "\n" + _("The other ranks were stopped. Fix the error above (it happened on rank {rank}; "
                     "errors on other ranks, if any, followed from it).").format(rank=rank)


def _raised(rank: int, nproc: int, error: dict[str, Any], simulated: bool, tail: str) -> str:
    if error["type"] == "SystemExit":
        return (_("rank {rank} of {nproc} exited with code {code} ({message}).").format(
                    rank=rank, nproc=nproc, code=error["exitcode"], message=error["message"])
                + "\n" + last_output(tail) + f"\n{error['traceback']}")
    hint = hint_for(f"{error['type']}: {error['message']}", simulated)
    return raised(rank, nproc, error) + (f"\n{hint}\n" if hint else "") + _followed(rank)


def raised(rank: int, nproc: int, error: dict[str, Any]) -> str:
    """The one telling of an error record (reporting.error_record), a launch's rank's or a warm session's:
    which rank, what it raised, and its traceback."""
    return (_("rank {rank} of {nproc} raised {error}").format(
        rank=rank, nproc=nproc, error=f"{error['type']}: {error['message']}")
            + (f"\n\n{error['traceback']}" if error["traceback"] else ""))


def _crashed(rank: int, nproc: int, stack: str, signal_name: str | None, tail: str) -> str:
    signal_name = signal_name or _faulthandler_signal(stack)
    name = _(" ({signal})").format(signal=signal_name) if signal_name else ""
    stack = "".join(  # the script's frames; not the worker's nor the module list
        line for line in stack.splitlines(True)
        if not re.search(r"fourcard_helpers.worker|<frozen runpy>|^Extension modules", line))
    return (sentences(_("rank {rank} of {nproc} crashed in native code{signal}.").format(
                rank=rank, nproc=nproc, signal=name), signal_hint(signal_name))
            + "\n" + last_output(tail) + shorten_paths(stack).strip() + "\n" + _followed(rank))


def _faulthandler_signal(stack: str) -> str | None:
    """The signal named in faulthandler's first line ('Fatal Python error: Aborted')."""
    names = {"Aborted": "SIGABRT", "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS",
             "Floating-point exception": "SIGFPE", "Illegal instruction": "SIGILL"}
    found = re.search(r"Fatal Python error: ([^\n]+)", stack)
    return names.get(found.group(1).strip()) if found else None


def _timed_out(run: RunDir, nproc: int, timeout: float, errors: dict[int, Any], log: str) -> LaunchError:
    finished = set(run.ranks(DONE))
    running = sorted(set(range(nproc)) - finished - set(errors))
    message = _("the launch ran past its timeout of {timeout} s; rank(s) {running} were still "
                "running and all ranks were stopped. A rank that waits forever usually sits in "
                "a collective (all_reduce, barrier, ...) that another rank never called; "
                "if the work is just slow, pass a larger timeout.").format(timeout=f"{timeout:g}", running=running)
    if not running:
        message = _("the launch ran past its timeout of {timeout} s although every rank had finished "
                    "its script; all ranks were stopped. A rank can be held at exit by a thread it "
                    "started (not a daemon) or an atexit handler; on a busy machine, pass a larger timeout."
                    ).format(timeout=f"{timeout:g}")
    elif finished:
        message = sentences(message, _("Rank(s) {finished} had finished their script while the others waited: look "
                                       "for a collective, or dist.init_process_group itself, that only some ranks "
                                       "reach.").format(finished=sorted(finished)))
    return LaunchError(message, running[0] if running else None, log)


def diagnose(run: RunDir, nproc: int, log: str, ending: Ending, simulated: bool = True) -> LaunchError | None:
    """The LaunchError that explains this launch, or None when every rank succeeded.

    `log` is the ranks' output as the notebook showed it (`[rankN] ` prefixed lines);
    `simulated` says the ranks ran on simulated cards (it decides which hints apply).
    """
    errors = run.read_json(ERROR)
    if ending.timeout is not None:
        return _timed_out(run, nproc, ending.timeout, errors, log)
    if ending.returncode == 0 and not errors:
        return None
    crashes = {rank: text for rank, text in run.read_text(CRASH).items() if text.strip()}
    exits = run.read_json(EXIT)
    signals = {rank: record["signal"] for rank, record in exits.items() if record.get("signal")}

    # Killed from outside (the out-of-memory killer, `kill -9`): no record of its own. torchrun
    # stops the other ranks of a failed launch with SIGTERM, so any other signal came from
    # outside and started the failure; the Python errors of its partners follow from it.
    killed = [rank for rank, name in signals.items()
              if name not in ("SIGTERM", "SIGINT") and rank not in crashes and rank not in errors]
    if killed:
        rank = killed[0]
        if rank in run.ranks(DONE):
            what = _("rank {rank} of {nproc} finished its script, then died while exiting, by {signal}.")
        else:
            what = _("rank {rank} of {nproc} was killed by {signal}.")
        message = sentences(what.format(rank=rank, nproc=nproc, signal=signals[rank]), signal_hint(signals[rank]))
        tail = rank_tail(log, rank)
        return LaunchError(message + ("\n" + last_output(tail) if tail else ""), rank, log)

    # Whichever rank wrote its error or crash record first names the culprit.
    failures = [(error["time"], rank) for rank, error in errors.items()]
    failures += [(run.file(CRASH, rank).stat().st_mtime, rank) for rank in crashes]
    if failures:
        _first, rank = min(failures)
        if rank in errors:
            return LaunchError(_raised(rank, nproc, errors[rank], simulated, rank_tail(log, rank)), rank, log)
        return LaunchError(_crashed(rank, nproc, crashes[rank], signals.get(rank), rank_tail(log, rank)), rank, log)

    if exits:  # a rank ended by itself with a non-zero code (os._exit) or was stopped
        rank = min(exits, key=lambda r: (exits[r]["exitcode"] < 0, r))  # an exit code before a signal
        record = exits[rank]
        if record["signal"]:
            how = _("rank {rank} of {nproc} was killed by {signal}.").format(rank=rank, nproc=nproc, signal=record["signal"])
        else:
            how = _("rank {rank} of {nproc} exited with code {code}.").format(rank=rank, nproc=nproc, code=record["exitcode"])
        tail = rank_tail(log, rank)
        return LaunchError(how + ("\n" + last_output(tail) if tail else ""), rank, log)

    done = set(run.ranks(DONE))
    if done == set(range(nproc)):
        return LaunchError(_(
            "every rank finished its script, then torchrun failed while the launch ended (exit status "
            "{status}). With several agents (nodes), each waits at torchrun's exit barrier for "
            "the others; an agent that failed, or that left with the rendezvous store it hosted, makes the "
            "others fail or wait there (lesson 12). torchrun's own output:").format(status=ending.returncode)
            + "\n" + ending.output[-3000:], None, log)
    if done:
        missing = sorted(set(range(nproc)) - done)
        return LaunchError(_("torchrun failed while rank(s) {missing} had not finished their script, and they left "
                             "no error of their own. torchrun's own output:").format(missing=missing)
                           + "\n" + ending.output[-3000:], missing[0], log)
    return LaunchError(_("torchrun failed before the ranks could run. Its own output:") + "\n" + ending.output[-3000:],
                       None, log)
