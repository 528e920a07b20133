"""How every process the course starts is started, found and stopped: one lifecycle for a launch
(`launch.py`) and for a warm session (`ranks.py`).

A notebook starts trees of processes: torchrun agents and their ranks; for a warm session also an
ipyparallel controller. Whichever way the notebook's part ends (the cell finishes, fails or is
interrupted, the kernel restarts or is killed), none of them may stay behind. The rules:

* **A group of its own.** Each tree's root starts in a session (process group) of its own, so that
  it can be signalled whole and the terminal's or kernel's Ctrl-C is not its.
* **Gone with the kernel.** Each root watches the read end of a pipe whose write end only the kernel
  holds (`KernelPipe`); end-of-file means the kernel is gone, however it ended, and the root stops
  its tree (`stop_when_kernel_dies`). Not a parent-death signal set by a hook that runs in the
  child before exec: `subprocess` documents such a hook as unsafe when the parent has threads (a
  kernel has several), and
  PR_SET_PDEATHSIG fires when the *thread* that started the child exits, so a launch started from a
  short-lived thread would die mid-run. The pipe needs neither.
* **Gone with torchrun.** torchrun starts each rank in a session of its own, so a rank asks Linux,
  in itself after exec, to kill it when its parent dies (`die_with_parent`).
* **Marked.** Every process carries rundir.LAUNCHER_ENV (the kernel's pid) in its environment:
  `marked_processes` finds what is left, whatever its group.
* **One stop sequence** (`stop`): SIGTERM to each group (torchrun passes it on to its ranks), a
  grace period, SIGKILL; then SIGKILL to every marked process still there (ranks in sessions of
  their own), and a wait until none is.

Standard library only: the agent, the ranks and the warm session's engines import this first.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable, Iterable

from .rundir import WATCH_FD_ENV

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent(signum: int = signal.SIGKILL) -> bool:
    """Ask Linux to send `signum` to this process when its parent dies; False where it cannot.

    Called in the process itself, after exec. CDLL(None) is the C library the interpreter already
    runs on (glibc and musl both provide prctl), not a library name that differs between systems.
    """
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    prctl(PR_SET_PDEATHSIG, signum)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)
    return True


class KernelPipe:
    """A pipe whose write end only this process (the kernel) holds; each tree's root gets the read end.

    Both ends are created non-inheritable, so no other child of the kernel holds the write end.
    `close()` (or the kernel's death, however it happens) gives every root end-of-file."""

    def __init__(self) -> None:
        self.child_end, self.kernel_end = os.pipe()

    def start(self, command: list[str], env: dict[str, str], output: int | IO[bytes]) -> subprocess.Popen[bytes]:
        """Start `command` as the root of a tree: a session of its own, watching this pipe."""
        return subprocess.Popen(
            command, env={**env, WATCH_FD_ENV: str(self.child_end)}, pass_fds=(self.child_end,),
            stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)

    def started(self) -> None:
        """Every root has its copy of the read end: ours would keep the pipe open after the kernel died."""
        if self.child_end >= 0:
            os.close(self.child_end)
            self.child_end = -1

    def close(self) -> None:
        """Tell every root the kernel is gone: each stops its tree (what already stopped ignores it)."""
        self.started()
        if self.kernel_end >= 0:
            os.close(self.kernel_end)
            self.kernel_end = -1


def stop_when_kernel_dies(on_kernel_death: Callable[[], None]) -> None:
    """In a tree's root: call `on_kernel_death` (in a daemon thread) once the kernel's pipe reaches
    end-of-file. The variable is removed, so that the root's own children do not inherit it."""
    watch = os.environ.pop(WATCH_FD_ENV, None)
    if watch is None:
        return

    def watch_pipe(fd: int) -> None:
        while os.read(fd, 1):  # the kernel never writes; b"" means every write end is closed
            pass
        on_kernel_death()

    threading.Thread(target=watch_pipe, args=(int(watch),), daemon=True).start()


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie has exited; only its exit code is left to collect)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def marked_processes(name: str, value: str) -> list[int]:
    """Pids of live processes whose environment holds `name=value`."""
    marker = f"{name}={value}".encode()
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0") and alive(int(entry.name)):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass


def stop(roots: Iterable[subprocess.Popen[bytes]], stragglers: Callable[[], list[int]], grace: float) -> None:
    """The one stop sequence: SIGTERM to each root's group; after `grace` seconds SIGKILL to a group
    still running; then SIGKILL to every pid `stragglers()` lists (processes in sessions of their
    own, such as ranks), again at each new listing, until it lists none or another `grace` seconds
    have passed."""
    roots = list(roots)
    running = [proc for proc in roots if proc.poll() is None]
    for proc in running:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in running:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
    for pid in stragglers():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for proc in roots:
        proc.wait()
    deadline = time.monotonic() + grace
    while (left := stragglers()) and time.monotonic() < deadline:
        for pid in left:  # killed again, or for the first time: a process that had only just started can be
            try:          # missing from the first listing (its environment not yet readable)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
