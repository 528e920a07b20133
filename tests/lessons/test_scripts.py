"""The scripts a lesson saves run unchanged with plain `torchrun`, as the lessons promise (what the
scripts' text must hold, read without running them, is tests/unit/test_script_text.py's).

The notebook's `%%torchrun` runs the very file it saves, in each rank as `python SCRIPT` runs it (the script
as `__main__`, its folder first on the path: fourcard_helpers/worker.py), under torchrun's own entry point,
in both roundings of every run of the suite. What the launcher adds reaches a script only through the
package (`detect()`, `report()`, which prints what it would send where no launcher is there), since a script
reads no variable but torchrun's own (test_script_text.py checks it). So a plain launch shows something more
only for a script that

* fails by design (a staged failure, an exercise's skeleton): it must end by itself, within its cell's
  timeout, where no notebook stops it;
* runs on several agents (`--nnodes N`: N bare agents at one rendezvous, as on N machines);
* is given arguments by its cell: a plain launch runs its defaults;
* keeps files in the temporary folder: two learners' runs side by side must not collide;
* imports a module beside it in scripts/;

and every lesson has at least one plain launch (its first script, where none of the above applies). Each
of those runs under a bare `python -m torch.distributed.run --standalone` with no arguments, from the
notebooks folder, on simulated cards (plain_launch_reasons in tests/helpers.py chooses them; the reason is
in the test's id). The suite is bound by CPU work, and every launch costs about 8 core-seconds of start-up
alone (a torchrun agent and four ranks, each importing torch): all 72 launches, with the second runs side by
side, took about 975 core-seconds on a 2-core AMD EPYC; these 31 (39 runs) about 470.

The launches run in the background, one after another, once the lessons' runs under another rounding
have ended (tests/lessons/conftest.py), beside the rest of the suite.
"""
from __future__ import annotations

import pytest

from helpers import plain_launch_reasons, shipped_launches

pytestmark = pytest.mark.slow  # every test here starts ranks, a kernel or a browser: left out by `-m "not slow"`

# Each launch of a lesson already runs its script twice in every run of the suite (the notebook under nbval,
# in each rounding), beside other tests, and every script ends with the cure for gloo's exit race, which
# tests/unit/test_script_text.py checks; many launches of one script, to see a rare race, are
# benchmarks/script_stress.py's job (every shipped launch, or those named). Here one plain run of each chosen
# script, and two side by side of one that keeps files in the temporary folder (helpers.launch_shipped_script).


PLAIN = [pytest.param(*launch, id=f"{launch[0]}: {'; '.join(reasons)}") for launch in shipped_launches()
         if (reasons := plain_launch_reasons(*launch))]


@pytest.mark.parametrize("script, nproc, nnodes, timeout, fails", PLAIN)
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
