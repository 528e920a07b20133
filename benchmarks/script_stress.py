"""Every shipped script, run again and again under plain `torchrun`: how often does a launch fail?

The lessons promise that each file in `notebooks/scripts/` runs unchanged with plain `torchrun`.
A launch that fails one time in twenty breaks that promise as surely as one that always fails,
and only repetition shows it. This runs every saved launch N times (the same command line as
tests/lessons/test_scripts.py, which CI runs in a short form) and prints, per script, the failures and
what they looked like:

* `exit abort`: a rank printed its last line, then died by SIGABRT while the process ended
  ("terminate called without an active exception"; lesson 00, "How a rank ends");
* `store lost`: an agent lost its connection to the rendezvous store (two-agent launches);
* `exit barrier`: an agent waited at torchrun's exit barrier for an agent that never came;
* `timeout`: the launch ran past its cell's timeout;
* otherwise the failing output's last line.

    python benchmarks/script_stress.py [--runs 20] [--busy 2] [--threads 1] [-k 05_] [--json FILE] [--keep DIR]

`--busy K` starts K processes that spin on a core each, beside the launches (a machine under
load). `--threads N` sets OMP_NUM_THREADS=N in every rank. The default, 1, is what a learner's
plain `torchrun` gives each rank anyway: torchrun sets OMP_NUM_THREADS=1 when it starts more than
one rank per agent and the variable is unset, and every shipped launch starts two or four. A
learner who exported another value is the case the default does not cover (`--threads 2`: eight
threads for four ranks). Staged failures (cells tagged `raises-exception`) must fail every time:
for them a success is counted as the failure.
Two scripts read what an earlier one wrote (NEEDS below): select the writer too (`-k 12_fsdp_`),
or every launch of the reader fails for want of its file.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from helpers import run_with_plain_torchrun, shipped_launches  # noqa: E402  (the tests' own launch)
from fourcard_helpers.rundir import THREADS_ENV  # noqa: E402

SIGNATURES = (  # (what it is called here, text that marks it in the launch's output)
    ("exit abort", "terminate called without an active exception"),
    ("store lost", "RendezvousConnectionError"),
    ("exit barrier", "wait timeout after"),
)


NEEDS = {  # script → the shipped script whose files it reads (in the same temporary folder)
    "scripts/05_evaluate_checkpoint.py": "scripts/05_ddp_recipe.py",
    "scripts/12_fsdp_load_on_two.py": "scripts/12_fsdp_save_on_four.py",
}


def signature(text: str, codes: list[int | None]) -> str:
    """A short name for how a failed launch failed."""
    if None in codes:
        return "timeout"
    for name, marker in SIGNATURES:
        if marker in text:
            return name
    if "SIGABRT" in text:
        return "SIGABRT"
    lines = [line for line in text.splitlines() if line.strip()]
    return ("other: " + lines[-1].strip()[:100]) if lines else "other: no output"


def spin() -> None:  # a busy process: one core's worth of load
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="launches of each script (default 20)")
    parser.add_argument("--busy", type=int, default=0, help="busy processes beside the launches")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS in every rank (default 1, torchrun's own)")
    parser.add_argument("-k", default="", help="only scripts whose name contains this")
    parser.add_argument("--json", type=Path, help="also write the counts to this file")
    parser.add_argument("--keep", type=Path, help="write each failed launch's output into this folder")
    args = parser.parse_args()
    launches = [launch for launch in shipped_launches() if args.k in launch[0]]
    chosen = {launch[0] for launch in launches}
    missing = sorted(f"{NEEDS[script]} (for {script})" for script in chosen if NEEDS.get(script, script) not in chosen)
    if missing:
        parser.error("-k leaves out what a selected script reads: " + ", ".join(missing) + "; widen -k")
    env = {THREADS_ENV: str(args.threads)}
    busy = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for proc in busy:
        proc.start()
    print(f"{len(launches)} scripts × {args.runs} runs; {os.cpu_count()} cores, {args.busy} busy processes, "
          f"OMP_NUM_THREADS={args.threads} in every rank", flush=True)
    results, started, load_at_start = {}, time.time(), os.getloadavg()[0]
    try:
        for script, nproc, nnodes, timeout, staged in launches:
            seen: Counter[str] = Counter()
            script_started = time.time()
            for _ in range(args.runs):
                codes, text = run_with_plain_torchrun(script, nproc, nnodes, timeout, env)
                failed = any(codes) if not staged else not any(code for code in codes if code is not None)
                if failed and args.keep:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    (args.keep / f"{Path(script).stem}.{sum(seen.values()) + 1}.log").write_text(text, encoding="utf-8")
                if failed:
                    seen["succeeded (staged failure)" if staged else signature(text, codes)] += 1
            seconds = (time.time() - script_started) / args.runs
            results[script] = {"runs": args.runs, "failures": sum(seen.values()), "signatures": dict(seen),
                               "seconds_per_run": round(seconds, 1)}
            shown = ", ".join(f"{name} ×{count}" for name, count in seen.items())
            print(f"{script:40} {sum(seen.values()):3} of {args.runs} failed  {seconds:5.1f} s a run  {shown}",
                  flush=True)
    finally:
        for proc in busy:
            proc.terminate()
            proc.join()
    total = sum(result["failures"] for result in results.values())
    print(f"{total} failures in {len(results) * args.runs} launches, {time.time() - started:.0f} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps({
            "command": "python benchmarks/script_stress.py " + " ".join(sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "busy_processes": args.busy, "omp_num_threads": args.threads,
            "load_average": [round(load_at_start, 1), round(os.getloadavg()[0], 1)],  # at the start and the end
            "scripts": results}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
