"""How every process the course starts is started, found and stopped: one lifecycle for a launch
(`launch.py`), a warm session (`warm_session.py`) and the practice SLURM cluster's daemons
(`slurm_daemons.py`, `slurm_guard.py`).

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
* **Marked.** Every process of a launch or a warm session carries rundir.LAUNCHER_ENV (the kernel's
  pid) in its environment, the practice cluster's daemons and jobs rundir.SLURM_ENV (its folder):
  `marked_processes` finds what is left, whatever its group.
* **One stop sequence** (`stop`): SIGTERM to each group (torchrun passes it on to its ranks), or to
  each process given by pid (the practice cluster's daemons), a grace period, SIGKILL; then SIGKILL
  to every straggler the caller lists (a launch: its ranks, in sessions of their own, from the run
  folder's pid records and from the folder's name in their environment), again at each new listing,
  until none is left.
* **One process table.** Whether a process runs, its environment, its children, which processes
  carry a mark: read from /proc here and nowhere else in the package, its tests and benchmarks, so that
  every part (the launcher, the warm session, the agent, the practice SLURM cluster, the tests) sees the
  same facts. Lessons 00, 04, 09 and 12 read /proc in their own code, since what a rank is and what it
  holds is what they teach.
* **One clock.** How often a wait looks (POLL_SECONDS), how long a process gets between SIGTERM and
  SIGKILL (GRACE_SECONDS) and how long the partners of a failed rank get (FAIL_FAST_SECONDS) are
  defined below, once; a wait for a process to be ready fails as soon as one it needs has died
  (`wait_until`).

Standard library only: the agent, the ranks and the warm session's engines import this first.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable, Iterable, Mapping, Union

from .rundir import LAUNCHER_ENV, RUN_DIR_ENV, SESSION_ENV, WATCH_FD_ENV, RunDir

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>

POLL_SECONDS = 0.05
"""How often a wait looks again (rank output, a process's state, a readiness file): small against
the seconds a launch takes, large against the cost of one look."""

GRACE_SECONDS = 3.0
"""Between SIGTERM and SIGKILL, for whatever the course stops (agents, a warm session, the practice
cluster's daemons): time for torchrun to pass SIGTERM on to its ranks and for a daemon to begin its
own shutdown, short enough that a learner who pressed stop is not kept waiting. What outlives it is
killed, so nothing depends on a graceful end (`down` removes a stopped cluster's state anyway)."""

FAIL_FAST_SECONDS = 15.0
"""After the first rank failed (raised, or its process ended), how long its partners get to end on
their own before everything is stopped: one rule for a launch and for a warm session's cell.

Why 15 s for both. In a launch the failing rank's traceback is recorded the moment it raised, and
torchrun itself stops the partners once the failed rank's process has exited (it looks every
0.1 s): the bound acts only on a partner that hangs, in a collective the failed rank never reached,
and a longer bound delays the report without changing it. In a warm session the partners may
still be finishing the cell, and a session whose other ranks finish survives the error: a short
bound would end sessions that had no reason to end. So the warm session's 15 s, chosen for a slow
rank on a busy machine, is the rule, and the launcher's 5 s is raised to it. Not more: it is the
longest a learner waits for the traceback of a rank whose partners hang."""

Target = Union[subprocess.Popen, int]


class FailFast:
    """The fail-fast rule, one for a launch and for a warm session's cell: from the moment a failure is
    first seen, the partners get FAIL_FAST_SECONDS to end on their own, and no longer."""

    def __init__(self) -> None:
        self.first: float | None = None

    def expired(self, failed: Callable[[], bool], now: float) -> bool:
        """Whether the partners' time is up at `now`; `failed()` is asked only until it first says yes."""
        if self.first is None and failed():
            self.first = now
        return self.first is not None and now - self.first > FAIL_FAST_SECONDS


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
        """Start `command` as the root of a tree (`start_session`), watching this pipe."""
        return start_session(command, {**env, WATCH_FD_ENV: str(self.child_end)}, output, pass_fds=(self.child_end,))

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


def stop_own_group() -> None:
    """The one way a tree's root stops itself and what runs in its group (the agent and the warm
    session's controller, once the kernel has died): SIGTERM to the group, which torchrun passes
    on to its ranks and the controller's handler turns into SIGKILL, then SIGKILL after
    GRACE_SECONDS to whatever of the group still runs, this process included."""
    group = os.getpgid(0)
    quiet_kill(group, signal.SIGTERM, group=True)
    threading.Event().wait(GRACE_SECONDS)
    quiet_kill(group, signal.SIGKILL, group=True)


def wait_for_kernel_death() -> None:
    """In a tree's root that exists only to clean up (the practice cluster's guard): block until
    the kernel's pipe reaches end-of-file."""
    gone = threading.Event()
    stop_when_kernel_dies(gone.set)
    gone.wait()


# -- the process table (/proc, read here only) ------------------------------------------------------
def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie has exited; only its exit code is left to collect)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def environment(pid: int) -> dict[str, str] | None:
    """The environment `pid` started with; None when it has ended or is not ours to read."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return dict(item.decode("utf-8", "replace").partition("=")[::2] for item in raw.split(b"\0") if b"=" in item)


def command_line(pid: int) -> list[str]:
    """The arguments `pid` was started with (empty when it has ended)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0")[:-1]]


def owner(pid: int) -> int | None:
    """The user id `pid` runs as; None when it has ended."""
    try:
        return Path(f"/proc/{pid}").stat().st_uid
    except OSError:
        return None


def pids() -> list[int]:
    """Every process on this machine (that this process may see)."""
    return [int(entry.name) for entry in Path("/proc").glob("[0-9]*")]


def children() -> dict[int, list[int]]:
    """Parent pid -> its children's pids, for every process now."""
    table: dict[int, list[int]] = {}
    for pid in pids():
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        table.setdefault(parent, []).append(pid)
    return table


def descendants(roots: Iterable[int]) -> list[int]:
    """`roots` and every process below them, those still running."""
    table, found, stack = children(), [], list(roots)
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(table.get(pid, []))
    return [pid for pid in found if alive(pid)]


def carries(pid: int, name: str, value: str) -> bool:
    """Whether `pid` runs with `name=value` in its environment: a recorded pid is still the process
    that was recorded, not another one that got the number later."""
    try:  # bytes compared, nothing decoded: the stop sequence asks this of every process, many times a second
        marked = f"{name}={value}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return marked and alive(pid)


def marked_processes(name: str, value: str) -> list[int]:
    """Pids of live processes whose environment holds `name=value`."""
    return [pid for pid in pids() if carries(pid, name, value)]


def memory_mb() -> int:
    """This machine's memory in MB (MemTotal), as slurmd counts it; 0 where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def listening(pid: int) -> set[str]:
    """The IPv4 addresses (hex, as /proc/net/tcp writes them) on which `pid` listens for TCP."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return {fields[1].split(":")[0] for fields in _tcp_table(pid) if fields[3] == "0A" and fields[9] in inodes}


def listens_on_port(pid: int, port: int) -> bool:
    """Whether anything in the network namespace of `pid` listens on TCP `port` (its own tables)."""
    return any(fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port for fields in _tcp_table(pid))


def _tcp_table(pid: int) -> list[list[str]]:
    rows = []
    for table in ("tcp", "tcp6"):
        rows += [line.split() for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]]
    return rows


# -- what the notebook started (its mark), and its ranks (their run folders' records) --------------
def leftover_processes(launcher_pid: int | None = None) -> list[int]:
    """Pids of torchrun or rank processes that launches from this process (or from the
    process `launcher_pid`, such as a kernel a test drives) left running.

    Always empty after a launch returns, fails or is interrupted; lessons and tests assert it.
    """
    return marked_processes(LAUNCHER_ENV, str(launcher_pid or os.getpid()))


def rank_pids(launcher_pid: int | None = None) -> dict[int, int]:
    """{global rank: pid} of the rank processes that launches from this process run now.

    What `py-spy dump --pid` and `kill -USR1` need to look inside a launch while it waits (lesson 12):
    each running launch's run folder, named in the environment of its processes (`leftover_processes()`),
    records every rank's pid (rundir.py), and a recorded pid counts while its process still carries that
    folder's name. A warm session's ranks record theirs too, but are left out here (their ranks would
    share the numbers of a launch's): `RankSession.pids` names them."""
    folders = {env.get(RUN_DIR_ENV) for pid in leftover_processes(launcher_pid)
               if (env := environment(pid)) and SESSION_ENV not in env}
    ranks = {}
    for folder in sorted(filter(None, folders)):
        ranks.update(running_ranks(RunDir(folder)))
    return dict(sorted(ranks.items()))


def running_ranks(run: RunDir) -> dict[int, int]:
    """{rank: pid} of the ranks of the launch in `run` that still run: a pid from the records, while
    its process carries the launch's folder (after it ended, the number may be another process's)."""
    return {rank: pid for rank, pid in run.pids().items() if carries(pid, RUN_DIR_ENV, str(run.path))}


# -- starting, waiting, stopping ---------------------------------------------------------------------
def start_session(command: list[str], env: Mapping[str, str], output: int | IO[bytes],
                  pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
    """The one way the course starts what it will stop: `command` in a session (process group) of its
    own, so that `stop` can signal it whole and the terminal's or kernel's Ctrl-C is not its; no
    input; its output and errors together into `output`. A tree's root (`KernelPipe.start`) and the
    practice cluster's daemons start so."""
    return subprocess.Popen(command, env=dict(env), pass_fds=pass_fds, stdin=subprocess.DEVNULL, stdout=output,
                            stderr=subprocess.STDOUT, start_new_session=True)


def free_ports(count: int = 1) -> list[int]:
    """Ports nothing listens on now on 127.0.0.1 (the kernel picks them, above 1024: no root needed).
    For what must be told its port before it starts (several torchrun agents, SLURM's daemons);
    another program taking one in the moment between is not guarded against (what then fails says so)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for probe in sockets:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


def group_alive(group: int) -> bool:
    """Whether any process of the process group `group` is still there (one not yet collected too)."""
    try:
        os.killpg(group, 0)  # signal 0 only asks
    except ProcessLookupError:
        return False
    except PermissionError:  # there, but not ours to signal
        return True
    return True


def quiet_kill(pid: int, signum: int, group: bool = False) -> None:
    """Send `signum` to `pid` (its group, with `group`); one that has ended, or is not ours to
    signal, is left alone."""
    try:
        (os.killpg if group else os.kill)(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def first_dead(processes: Mapping[str, Target]) -> str | None:
    """The name of the first of `processes` (name -> Popen or pid) that no longer runs; None if all run."""
    for name, process in processes.items():
        if not (process.poll() is None if isinstance(process, subprocess.Popen) else alive(process)):
            return name
    return None


def wait_until(ready: Callable[[], bool], timeout: float, died: Callable[[], str | None] = lambda: None) -> str | None:
    """The one wait for something to be ready: look every POLL_SECONDS until `ready()`, and return None.

    Fails fast: as soon as `died()` says something (a process the wait needs has ended, see
    `first_dead`), return what it said, without waiting out the timeout. Raises TimeoutError after
    `timeout` seconds, a bound for what never comes, not a measure of how long it should take."""
    deadline = time.monotonic() + timeout
    while not ready():
        why = died()
        if why:
            return why
        if time.monotonic() > deadline:
            raise TimeoutError(timeout)
        time.sleep(POLL_SECONDS)
    return None


def _running(target: Target) -> bool:
    return target.poll() is None if isinstance(target, subprocess.Popen) else alive(target)


def _signal(target: Target, signum: int) -> None:
    """A Popen is the root of a group of its own (KernelPipe.start): the whole group; a pid, itself."""
    if isinstance(target, subprocess.Popen):
        quiet_kill(target.pid, signum, group=True)
    else:
        quiet_kill(target, signum)


def stop(targets: Iterable[Target], stragglers: Callable[[], list[int]] = list, grace: float = GRACE_SECONDS,
         ask: int = signal.SIGTERM) -> None:
    """The one stop sequence: `ask` (SIGTERM; SIGINT for a program that tidies up on Ctrl-C, as pytest shuts
    its Jupyter kernel down) to each target (a Popen: its whole group; a pid: that process); after `grace`
    seconds SIGKILL to a target still running; then SIGKILL to every pid `stragglers()` lists (processes in
    sessions of their own, such as ranks), again at each new listing, until it lists none or another
    `grace` seconds have passed."""
    targets = list(targets)
    running = [target for target in targets if _running(target)]
    for target in running:
        _signal(target, ask)
    deadline = time.monotonic() + grace
    for target in running:
        if isinstance(target, subprocess.Popen):
            try:
                target.wait(max(0.0, deadline - time.monotonic()))
                continue
            except subprocess.TimeoutExpired:
                pass
        else:
            while alive(target) and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)
            if not alive(target):
                continue
        _signal(target, signal.SIGKILL)
    for pid in stragglers():
        quiet_kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    for target in targets:
        if isinstance(target, subprocess.Popen):
            target.wait()
        else:  # not our child: it is gone once it is no longer listed, or a zombie its parent will collect
            while alive(target) and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)
    while (left := stragglers()) and time.monotonic() < deadline:
        for pid in left:  # killed again, or for the first time: a process that had only just started can be
            quiet_kill(pid, signal.SIGKILL)  # missing from the first listing (its environment not yet readable)
        time.sleep(POLL_SECONDS)
