"""Do gloo ranks come back after an elastic restart, with and without their own rendezvous store?

    python benchmarks/restart_store.py [--repeats 20] [--timeout 60] [--out notebooks/measured/12_restart_store.json]

Launches a 2-rank script under `--max-restarts=1` whose rank 1 SIGKILLs itself on the first
attempt, alternating TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0 (torchrun's default: the ranks of every
attempt share one store that the agent keeps) and =1 (what the launcher sets for restarts, see
launch.py), and records how each launch ended: restarted and finished; failed, naming a connection
(the launcher's error mentions one: a refused or closed connection, such as a restarted rank
dialling the dead attempt's address); failed otherwise; or not finished when --timeout ran out
(this cannot tell a hang from a slow launch, only that it had not ended). Lesson 12 prints the
counts from --out, and each launch's ending and seconds in the order they ran. Outcomes vary from
run to run, which is why this is a measurement and not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections import Counter
from datetime import date
from pathlib import Path

import torch

from fourcard_helpers.launch import LaunchError, torchrun
from fourcard_helpers.rundir import OWN_STORE_ENV as RESTART_ENV

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
OUT = Path(__file__).resolve().parent.parent / "notebooks" / "measured" / "12_restart_store.json"


def outcome(error: LaunchError) -> str:
    """How a launch that raised ended, from the launcher's message."""
    text = str(error)
    if "timeout" in text.split(";")[0]:
        return "not finished at the timeout"
    return "failed, naming a connection" if "connect" in text.lower() else "failed otherwise"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--out", type=Path, default=OUT, help="where to write the counts (JSON)")
    args = parser.parse_args()
    script = Path(tempfile.mkdtemp()) / "restart.py"
    script.write_text(SCRIPT)
    outcomes: dict[str, Counter[str]] = {"0": Counter(), "1": Counter()}
    launches: dict[str, list[list]] = {"0": [], "1": []}  # [outcome, seconds] in the order they ran
    for _ in range(args.repeats):
        for value in ("0", "1"):  # alternating, so that machine load hits both alike
            started = time.monotonic()
            try:
                result = torchrun(script, nproc=2, max_restarts=1, timeout=args.timeout, echo=False,
                                  env={RESTART_ENV: value})
                how = "restarted and finished" if result.values("attempt") == [1, 1] else "finished without a restart"
            except LaunchError as error:
                how = outcome(error)
            seconds = time.monotonic() - started
            outcomes[value][how] += 1
            launches[value].append([how, round(seconds, 1)])
            print(f"{RESTART_ENV}={value}: {how} ({seconds:.1f} s)", flush=True)
    for value, counts in outcomes.items():
        print(f"{RESTART_ENV}={value}: " + ", ".join(f"{n} {how}" for how, n in sorted(counts.items())))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "conditions": (f"{date.today()}, {platform.machine()} CPU, {os.cpu_count()} cores, torch {torch.__version__}, "
                       f"gloo, 2 ranks on one torchrun agent, --max-restarts=1, rank 1 SIGKILLed once on the first "
                       f"attempt, timeout {args.timeout:g} s per launch, load average {load:.1f} at the end"),
        "launches_per_setting": args.repeats,
        "outcomes": {f"{RESTART_ENV}={value}": dict(sorted(counts.items())) for value, counts in outcomes.items()},
        "launches": {f"{RESTART_ENV}={value}": runs for value, runs in launches.items()},
    }, indent=1) + "\n")
    print(f"written to {args.out.name}")


if __name__ == "__main__":
    main()
