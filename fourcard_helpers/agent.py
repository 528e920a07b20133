"""What the launcher starts: torchrun itself, plus two things a notebook needs from it.

`python -m fourcard_helpers.agent TORCHRUN-ARGS...` runs torchrun's own entry point
(`torch.distributed.run.main`) with the same arguments, and

* writes an `exit` record per failed rank (exit code, or the signal that killed it) into the
  run folder, from torchrun's own `ChildFailedError`: structured data, where the printed
  summary of the same facts is prose whose layout changes between PyTorch releases;
  the rank torchrun saw fail first is marked `first` (torchrun's "root cause");
* stops itself, and so its ranks, when the notebook's kernel dies (lifecycle.py).

The launcher and the warm session both start torchrun through it.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

from .lifecycle import stop_when_kernel_dies
from .rundir import EXIT, RunDir

STOP_SECONDS = 10.0  # after SIGTERM, how long torchrun gets to stop its ranks before SIGKILL


def _stop_torchrun() -> None:
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
    stop_when_kernel_dies(_stop_torchrun)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(argv)
    except ChildFailedError as failed:
        run = RunDir.from_env()
        if run is not None:
            first, _ = failed.get_first_failure()
            for rank, failure in failed.failures.items():
                run.write_json(EXIT, rank, {"exitcode": failure.exitcode, "signal": _signal_name(failure.exitcode),
                                            "first": rank == first})
        raise


if __name__ == "__main__":
    main(sys.argv[1:])
