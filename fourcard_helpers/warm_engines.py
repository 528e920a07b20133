"""The warm session's engines (see warm_session.py): its controller and its ranks, with the course's exit guarantees.

    python -m fourcard_helpers.warm_engines controller ARGS...   # ipyparallel's controller
    python -m fourcard_helpers.agent ... -m fourcard_helpers.warm_engines engine ARGS...

The controller and the engines are ipyparallel's own; this module changes only how they die.
ipyparallel stops gracefully on SIGTERM, but a rank busy in a cell (or stuck in a collective)
never gets round to it, and torchrun then waits half a minute before it kills. Here:

* a rank dies with its parent (lifecycle.die_with_parent): torchrun starts each rank in a
  session of its own, so if torchrun is killed nothing else would end the rank; and SIGTERM
  (torchrun stopping its ranks) ends the rank at once;
* SIGTERM to the controller (the kernel's stop) kills the controller's whole process group, which
  holds its helper processes; so does the kernel's death (lifecycle.py's pipe), through the one
  stop of a tree's root (lifecycle.stop_own_group), whose SIGTERM this handler answers.

Both are ipyparallel's application classes with one method overridden, `init_signal` (where
ipyparallel installs its own, graceful handlers), started with traitlets' public
`launch_instance`, as ipyparallel's own `main` does: nothing of ipyparallel is patched.

It imports nothing but the standard library before ipyparallel starts.
"""
from __future__ import annotations

import os
import signal
import sys
from types import FrameType

from .lifecycle import die_with_parent, quiet_kill, stop_own_group, stop_when_kernel_dies
from .rundir import PID, RANK_ENV, RunDir


def _exit_now(signum: int, frame: FrameType | None) -> None:
    os._exit(128 + signum)


def _kill_my_group(signum: int, frame: FrameType | None = None) -> None:
    if os.getpgid(0) == os.getpid():  # started as the leader of a group of its own
        quiet_kill(os.getpid(), signal.SIGKILL, group=True)
    os._exit(128 + signum)


def engine(argv: list[str]) -> None:
    """One rank: an ipyparallel engine that ends on SIGTERM or when torchrun dies, its pid recorded in the
    run folder as a launch's rank records its own (rundir.py), so that the session and `rank_pids()` find it."""
    die_with_parent(signal.SIGKILL)
    run = RunDir.from_env()
    if run is not None:
        run.write(PID, int(os.environ[RANK_ENV]), str(os.getpid()))
    from ipyparallel.engine.app import IPEngine

    class Engine(IPEngine):
        def init_signal(self) -> None:
            signal.signal(signal.SIGTERM, _exit_now)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # as ipyparallel: the kernel's Ctrl-C is not for ranks

    Engine.launch_instance(argv)


def controller(argv: list[str]) -> None:
    """ipyparallel's controller, which takes its helper processes with it on SIGTERM or when the
    kernel dies."""
    stop_when_kernel_dies(stop_own_group)
    from ipyparallel.controller.app import IPController

    class Controller(IPController):
        def init_signal(self) -> None:
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, _kill_my_group)

    Controller.launch_instance(argv)


if __name__ == "__main__":
    {"engine": engine, "controller": controller}[sys.argv[1]](sys.argv[2:])
