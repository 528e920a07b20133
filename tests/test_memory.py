"""PeakMemory: the most bytes of tensors held at once, on the CPU route (the profiler's record)."""
from __future__ import annotations

import torch

from fourcard_helpers import PeakMemory

MiB = 2**20


def test_a_moment_counts_at_the_peak_and_what_is_kept_counts_after() -> None:
    meter = PeakMemory(torch.device("cpu"))
    with meter.phase("kept and a moment"):
        kept = torch.empty(MiB)          # 4 MiB, kept
        moment = torch.ones(2 * MiB)     # 8 MiB, for a moment
        del moment
    with meter.phase("after"):
        more = torch.empty(MiB // 2)     # 2 MiB on top of what is kept
    peaks = meter.peaks()
    assert peaks == {"kept and a moment": 12 * MiB, "after": 6 * MiB}
    del kept, more


def test_the_peak_inside_an_operation_and_its_backward_is_seen() -> None:
    meter = PeakMemory(torch.device("cpu"))
    x = torch.ones(MiB, requires_grad=True)          # 4 MiB
    with meter.phase("backward"):
        (x * 3).sum().backward()                     # x * 3 for a moment, then the gradient, kept
    peaks = meter.peaks()
    assert peaks["backward"] >= 4 * MiB + 4 * MiB     # x and its gradient at least
    assert peaks["backward"] < 4 * MiB + 4 * MiB + 4 * MiB + 1024   # never x, x * 3 and the gradient all at once, here
    assert torch.equal(x.grad, torch.full((MiB,), 3.0))


def test_the_profilers_log_lines_stay_out_of_the_output(capfd) -> None:
    meter = PeakMemory(torch.device("cpu"))
    with meter.phase("one"):
        torch.empty(16)
    meter.peaks()
    assert "profiler_st" not in capfd.readouterr().err
