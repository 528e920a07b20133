"""Does the cost model predict this machine's all-reduce times? Timing checks of lesson 06.

Timing thresholds do not belong in notebooks (shared machines are noisy), so lesson 06 only
prints its numbers and this script checks them. It runs the lesson's own sweep script
(notebooks/scripts/06_allreduce_sweep.py, saved by the notebook) on four cards, several
sweeps in one launch, keeps the best time per size (as the lesson does: on a shared machine
other programs only ever add time), and checks:

1. the alpha–beta model (`fourcard_helpers.costmodel.AlphaBeta.fit`, worst-case fit) fitted
   to the measurements from 64 KB to 64 MB predicts every one of them within ±25%;
2. the hand-written ring all-reduce is within 2× of `dist.all_reduce` at 4 MB.

It also prints how well a fit to one sweep predicts the others, as a measure of the noise.
Exit status 0 when both checks pass, 1 otherwise. Run it on a quiet machine:

    .venv/bin/python benchmarks/costmodel_accuracy.py [--sweeps 5]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fourcard_helpers import torchrun
from fourcard_helpers.costmodel import AlphaBeta

SCRIPT = Path(__file__).resolve().parent.parent / "notebooks" / "scripts" / "06_allreduce_sweep.py"
FIT_FROM = 64 * 1024  # below this the time is flat (pure latency) on every machine
MAX_ERROR = 0.25      # the model must predict the measured times within ±25%
MAX_RING_RATIO = 2.0  # the hand-written ring may take at most twice the built-in's time at 4 MB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweeps", type=int, default=5, help="sweeps over all sizes in the launch")
    options = parser.parse_args()
    result = torchrun(SCRIPT, nproc=4, args=[str(options.sweeps)], echo=False)
    timings = result.reports[0]["timings"]
    sizes, ring_sizes = timings["sizes"], timings["ring_sizes"]
    def best(sweeps: list[list[list[float]]]) -> list[float]:  # [sweep][size][repeat] -> best per size
        return [min(t for trials in column for t in trials) for column in zip(*sweeps)]

    builtin, ring = best(timings["builtin"]), best(timings["ring"])
    print(f"{result.cards.describe()}; {options.sweeps} sweeps, best time per size")

    points = [(s, t) for s, t in zip(sizes, builtin) if s >= FIT_FROM]
    fit = AlphaBeta.fit([s for s, _ in points], [t for _, t in points], worst_case=True)
    errors = fit.relative_errors([s for s, _ in points], [t for _, t in points])
    least_squares = AlphaBeta.fit([s for s, _ in points], [t for _, t in points])
    ls_worst = max(abs(e) for e in least_squares.relative_errors([s for s, _ in points], [t for _, t in points]))
    print(f"fit: alpha = {fit.alpha * 1e6:,.0f} µs, busbw = {fit.busbw_gbs(4):.3f} GB/s")
    for (size, seconds), error in zip(points, errors):
        print(f"  {size / 1024:>8,.0f} KB  measured {seconds * 1e3:9.3f} ms  predicted {fit.seconds(size) * 1e3:9.3f} ms  {error:+6.1%}")
    worst = max(abs(e) for e in errors)
    print(f"largest prediction error, 64 KB – 64 MB: {worst:.1%} (limit {MAX_ERROR:.0%}); "
          f"a least-squares fit would be off by up to {ls_worst:.1%}")

    per_sweep = [best([sweep]) for sweep in timings["builtin"]]
    for index, sweep in enumerate(per_sweep):  # out of sample: fit one sweep, predict the others
        one = AlphaBeta.fit([s for s in sizes if s >= FIT_FROM], [t for s, t in zip(sizes, sweep) if s >= FIT_FROM],
                            worst_case=True)
        others = [t for j, other in enumerate(per_sweep) if j != index
                  for t in one.relative_errors([s for s in sizes if s >= FIT_FROM],
                                               [t for s, t in zip(sizes, other) if s >= FIT_FROM])]
        if others:
            print(f"  fit to sweep {index + 1} predicts the other sweeps within {max(abs(e) for e in others):.1%}")

    ratio = ring[ring_sizes.index(4 * 2**20)] / builtin[sizes.index(4 * 2**20)]
    print(f"hand-written ring / dist.all_reduce at 4 MB: {ratio:.2f}× (limit {MAX_RING_RATIO:g}×)")

    failures = []
    if worst > MAX_ERROR:
        failures.append(f"cost model error {worst:.1%} > {MAX_ERROR:.0%}")
    if ratio > MAX_RING_RATIO:
        failures.append(f"ring ratio {ratio:.2f} > {MAX_RING_RATIO:g}")
    print("FAIL: " + "; ".join(failures) if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
