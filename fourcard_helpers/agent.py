"""What the launcher starts: torchrun itself, plus two things a notebook needs from it.

`python -m fourcard_helpers.agent TORCHRUN-ARGS...` runs torchrun's own entry point
(`torch.distributed.run.main`) with the same arguments, and

* writes an `exit` record per failed rank (exit code, or the signal that killed it) into the
  run folder, from torchrun's own `ChildFailedError`: structured data, where the printed
  summary of the same facts is prose whose layout changes between PyTorch releases;
  the rank torchrun saw fail first is marked `first` (torchrun's "root cause");
* stops itself, and so its ranks, when the notebook's kernel dies (lifecycle.py).

The launcher and the warm session both start torchrun through it, with the one command line
`command` builds.
"""
from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Iterable

from .lifecycle import stop_own_group, stop_when_kernel_dies
from .rundir import EXIT, RunDir


def command(nnodes: int, nproc_per_node: int, endpoint: str, run_id: str, module: str, args: Iterable[str] = (),
            max_restarts: int = 0, is_host: bool | None = None, log_dir: Path | None = None) -> list[str]:
    """The one torchrun command line of the course, for a launch's agent (one per node) and a warm
    session's: torchrun's own c10d rendezvous at `endpoint` ("127.0.0.1:0": the agent picks a free port,
    when it is the only one), the script run as `python -m module ARGS...` on every rank, torchrun looking
    at its ranks every 0.1 s (its default, 5 s, would make failing fast wait for it). `is_host` (several
    agents): whether this agent hosts the rendezvous store."""
    host = [f"--rdzv-conf=is_host={'true' if is_host else 'false'}"] if is_host is not None else []
    logs = [f"--log-dir={log_dir}"] if log_dir is not None else []
    return [sys.executable, "-m", "fourcard_helpers.agent", f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}", *host,
            f"--max-restarts={max_restarts}", "--monitor-interval=0.1", *logs, "-m", module, *map(str, args)]


def _signal_name(exitcode: int) -> str | None:
    """'SIGKILL' for exit code -9 (killed by signal 9); None for a normal exit."""
    try:
        return signal.Signals(-exitcode).name if exitcode < 0 else None
    except ValueError:
        return f"signal {-exitcode}"


def main(argv: list[str]) -> None:
    stop_when_kernel_dies(stop_own_group)  # torchrun passes SIGTERM on to every rank
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
