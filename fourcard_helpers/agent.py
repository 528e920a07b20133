"""What the launcher starts: torchrun itself, plus two things a notebook needs from it.

`python -m fourcard_helpers.agent TORCHRUN-ARGS...` runs torchrun's own entry point
(`torch.distributed.run.main`) with the same arguments, and

* writes an `exit` record per failed rank (exit code, or the signal that killed it) into the
  run folder, from torchrun's own `ChildFailedError`: structured data, where the printed
  summary of the same facts is prose whose layout changes between PyTorch releases;
* stops itself when the notebook's kernel dies. The kernel hands it the read end of a pipe
  whose write end only the kernel holds; end-of-file on it means the kernel is gone, however
  it ended. This replaces the parent-death signal the kernel used to set in a `preexec_fn`:
  Python documents `preexec_fn` as unsafe when the parent has threads (a kernel has several),
  and PR_SET_PDEATHSIG fires when the *thread* that started the child exits, so a launch
  started from a short-lived thread would be killed mid-run. The pipe needs neither.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

from .rundir import EXIT, RunDir

WATCH_FD_ENV = "FOURCARD_WATCH_FD"  # the read end of the kernel's pipe
STOP_SECONDS = 10.0  # after SIGTERM, how long torchrun gets to stop its ranks before SIGKILL


def _stop_when_kernel_dies(fd: int) -> None:
    """Block until the kernel's end of the pipe closes, then stop torchrun and its ranks."""
    while os.read(fd, 1):  # the kernel never writes; b"" means every write end is closed
        pass
    os.kill(os.getpid(), signal.SIGTERM)  # torchrun's handler passes it on to every rank
    threading.Event().wait(STOP_SECONDS)
    os.kill(os.getpid(), signal.SIGKILL)  # the ranks follow through their own death signal


def _signal_name(exitcode: int) -> str | None:
    """'SIGKILL' for exit code -9 (killed by signal 9); None for a normal exit."""
    try:
        return signal.Signals(-exitcode).name if exitcode < 0 else None
    except ValueError:
        return f"signal {-exitcode}"


def main(argv: list[str]) -> None:
    watch = os.environ.pop(WATCH_FD_ENV, None)  # the ranks must not inherit the variable
    if watch is not None:
        threading.Thread(target=_stop_when_kernel_dies, args=(int(watch),), daemon=True).start()
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(argv)
    except ChildFailedError as failed:
        run = RunDir.from_env()
        if run is not None:
            for rank, failure in failed.failures.items():
                run.write_json(EXIT, rank, {"exitcode": failure.exitcode, "signal": _signal_name(failure.exitcode)})
        raise


if __name__ == "__main__":
    main(sys.argv[1:])
