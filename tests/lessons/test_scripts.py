"""Every script a lesson saves runs unchanged with plain `torchrun`, as the lessons promise (what the
scripts' text must hold, read without running them, is tests/unit/test_script_text.py's).

The notebook's `%%torchrun` adds live output and results, nothing a script depends on: here
each shipped script runs under a bare `python -m torch.distributed.run --standalone` (for a cell
that says `--nnodes N`: N bare agents at one rendezvous, as on N machines), with no arguments,
from the notebooks folder (where the kernel runs it), on simulated cards. A script whose cell is
a staged failure (tagged `raises-exception`) or an exercise's skeleton (which the notebook saves
but does not launch) must fail here too, by itself and within its cell's timeout.

The launches run in the background, one after another, once the lessons' runs under another rounding
have ended (tests/lessons/conftest.py), beside the rest of the suite: run alone, after the process tests,
they took 1104 s of a local run of the whole suite on two cores, which the tests and notebooks after
them kept only 60 to 80 % busy.
"""
from __future__ import annotations

import pytest

from helpers import shipped_launches

pytestmark = pytest.mark.slow  # every test here starts ranks, a kernel or a browser: left out by `-m "not slow"`

# Each launch of a lesson already runs its script twice in every run of the suite (the notebook under nbval,
# in each rounding), beside other tests, and every script ends with the cure for gloo's exit race, which
# tests/unit/test_script_text.py checks; many launches of one script, to see a rare race, are
# benchmarks/script_stress.py's job. Here one plain run of each proves "unchanged with plain torchrun", and a
# script that keeps files in the temporary folder runs twice side by side (helpers.launch_shipped_script).


@pytest.mark.parametrize("script, nproc, nnodes, timeout, fails", shipped_launches(), ids=lambda v: str(v))
def test_script_runs_with_plain_torchrun(script: str, nproc: int, nnodes: int, timeout: float, fails: bool,
                                         launched_with_plain_torchrun: list[tuple[list[int | None], str]]) -> None:
    runs = len(launched_with_plain_torchrun)
    for run, (codes, text) in enumerate(launched_with_plain_torchrun, start=1):
        if None in codes:
            pytest.fail(f"{script} (run {run}) did not end within {timeout + 60:g} s:\n{text[-3000:]}")
        if fails:
            assert any(codes), f"{script} is a staged failure but succeeded:\n{text[-3000:]}"
        else:
            assert codes == [0] * nnodes, f"{script} failed under plain torchrun (run {run} of {runs}):\n{text[-3000:]}"
