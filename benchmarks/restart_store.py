"""Do gloo ranks come back after an elastic restart, with and without their own rendezvous store?

    python benchmarks/restart_store.py [--repeats 4] [--timeout 120]

Launches a 2-rank script under `--max-restarts=1` whose rank 1 SIGKILLs itself on the first
attempt, alternating TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0 (torchrun's default: the ranks of every
attempt share one store that the agent keeps) and =1 (what the launcher sets for restarts, see
launch.py), and prints how each launch ended: restarted and finished, failed, or still stuck in
init_process_group at --timeout (pytorch/pytorch#135712). Its outcomes vary from run to run,
which is why this is a measurement and not a test.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from pathlib import Path

from fourcard_helpers.launch import LaunchError, RESTART_ENV, torchrun

SCRIPT = """
import os
import torch.distributed as dist
from fourcard_helpers import report
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 1 and attempt == 0:
    os.kill(os.getpid(), 9)
dist.barrier()
report(attempt=attempt)
dist.destroy_process_group()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    script = Path(tempfile.mkdtemp()) / "restart.py"
    script.write_text(SCRIPT)
    outcomes: dict[str, Counter[str]] = {"0": Counter(), "1": Counter()}
    for _ in range(args.repeats):
        for value in ("0", "1"):  # alternating, so that machine load hits both alike
            started = time.monotonic()
            try:
                result = torchrun(script, nproc=2, max_restarts=1, timeout=args.timeout, echo=False,
                                  env={RESTART_ENV: value})
                how = "restarted and finished" if result.values("attempt") == [1, 1] else "finished without a restart"
            except LaunchError as error:
                how = "stuck past the timeout" if "timeout" in str(error).split(";")[0] else "failed"
            outcomes[value][how] += 1
            print(f"{RESTART_ENV}={value}: {how} ({time.monotonic() - started:.1f} s)", flush=True)
    for value, counts in outcomes.items():
        print(f"{RESTART_ENV}={value}: " + ", ".join(f"{n} {how}" for how, n in sorted(counts.items())))


if __name__ == "__main__":
    main()
