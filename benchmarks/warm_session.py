"""Per-cell latency of a small all-reduce: warm session (`%%ranks`) vs a cold launch (`%%torchrun`).

    python benchmarks/warm_session.py [--nproc 4] [--rounds 5] [--cells 20] [--goal-ms 50]

Both run the same all-reduce of a 4-number tensor on `nproc` ranks, as a learner's cell would:
  * warm: `%%ranks` in an IPython shell, in a session started once (its start-up is timed too);
  * cold: `%%torchrun` of the same code as a whole script (start ranks, form the group, all-reduce,
    tear down), which is what every cell costs without a session.
They alternate, `rounds` times (one cold launch, then `cells` warm cells), so that load on a shared
machine hits both alike; the figures printed are medians. Exits 1 when the warm median exceeds
--goal-ms. Timing belongs here, not in the pass/fail tests.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time

from IPython.core.interactiveshell import InteractiveShell

WARM_CELL = "x = torch.tensor([rank + 1.0] * 4)\ndist.all_reduce(x)\n"
COLD_SCRIPT = """import os, torch, torch.distributed as dist
from fourcard_helpers import detect
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank = dist.get_rank()
device = cards.device(int(os.environ["LOCAL_RANK"]))
if cards.kind == "cuda":
    torch.cuda.set_device(device)
x = torch.tensor([rank + 1.0] * 4, device=device)
dist.all_reduce(x)
dist.destroy_process_group()
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cells", type=int, default=20)
    parser.add_argument("--goal-ms", type=float, default=50.0)
    options = parser.parse_args()
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "fourcard_helpers")
    quiet = contextlib.redirect_stdout(io.StringIO())

    started = time.perf_counter()
    with quiet:
        shell.run_line_magic("ranks", f"start -n {options.nproc} --timeout 600")
    session_start = time.perf_counter() - started
    warm, cold = [], []
    try:
        for _ in range(options.rounds):
            started = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                shell.run_cell_magic("torchrun", f"-n {options.nproc} --timeout 600", COLD_SCRIPT)
            cold.append(time.perf_counter() - started)
            for _ in range(options.cells):
                started = time.perf_counter()
                shell.run_cell_magic("ranks", "", WARM_CELL)
                warm.append(time.perf_counter() - started)
        totals = shell.run_cell_magic("ranks", "", "x.tolist()")
    finally:
        with contextlib.redirect_stdout(io.StringIO()):
            shell.run_line_magic("ranks", "stop")
    expected = float(sum(range(1, options.nproc + 1)))
    assert all(total == [expected] * 4 for total in totals), totals  # the warm all-reduce summed

    warm_ms, cold_ms = statistics.median(warm) * 1e3, statistics.median(cold) * 1e3
    print(f"{options.nproc} ranks; all-reduce of 4 float32 numbers per cell; medians on a shared machine")
    print(f"  warm session start-up (once):     {session_start:8.1f} s")
    print(f"  cold %%torchrun cell  (n={len(cold):3d}):    {cold_ms:8.0f} ms   (min {min(cold) * 1e3:.0f} ms)")
    print(f"  warm %%ranks cell     (n={len(warm):3d}):    {warm_ms:8.1f} ms   (min {min(warm) * 1e3:.1f} ms, "
          f"90th percentile {statistics.quantiles(warm, n=10)[-1] * 1e3:.1f} ms)")
    print(f"  cold / warm: {cold_ms / warm_ms:.0f}×; the session pays for itself after "
          f"{session_start / (statistics.median(cold) - statistics.median(warm)):.1f} cells")
    met = warm_ms <= options.goal_ms
    print(f"  goal ≤ {options.goal_ms:g} ms per warm cell: {'met' if met else 'NOT met'}")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
