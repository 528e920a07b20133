"""The scripts a lesson saves run unchanged with plain `torchrun`, as the lessons promise (what the
scripts' text must hold, read without running them, is tests/unit/test_script_text.py's).

The notebook's `%%torchrun` runs the very file it saves, under torchrun's own entry point, in both roundings
of every run of the suite; each rank runs it through fourcard_helpers/worker.py, with the script's folder
first on the path and its arguments in `sys.argv`. How that launch differs from a learner's plain one, and
what here covers each difference:

* what no notebook does for a plain launch: stop a script that fails, at its cell's timeout; start several
  agents at one rendezvous; pass the cell's arguments (a plain launch runs the defaults); keep a learner's
  files apart from another's: each script with one of these is launched plain, a script that keeps files in
  the temporary folder twice side by side;
* what only the notebook's launch sets: the barrier that ends init_process_group (a script with no collective
  of its own is launched plain), matplotlib's backend (a script that imports matplotlib is launched plain),
  the notebooks folder and the repository on the path (a script that imports a module from the course's folders
  is launched plain), the run folder through which `report()` sends its values (a plain launch prints them:
  every plain launch below shows it), one thread a rank on this machine's cores (on two cores, the same one);
* what the worker does in the rank: the script runs in a namespace of its own named `__main__` and its rank ends
  without Python's teardown (every script that joins a group ends that way itself: test_script_text.py); the
  DDP doctor watches a few calls; the output goes to files: none of it changes what a script computes;
* a script reads no variable but torchrun's and the devices' itself (test_script_text.py checks it), so the
  launcher's other variables reach it only through torch, matplotlib or the package, as above.

plain_launch_reasons in tests/helpers.py chooses the launches by those rules, and where a lesson has none that
succeeds, its first script that does, so that every lesson that saves scripts shows one running plain; each
test's id says why it runs. Each runs under a bare `python -m torch.distributed.run --standalone` with no
arguments, from the notebooks folder, on simulated cards.

The suite is bound by CPU work, and every launch costs about 8 core-seconds of start-up alone (a torchrun agent
and four ranks, each importing torch). Measured once, on an otherwise idle 2-core AMD EPYC (torch 2.13.0+cpu),
as the CPU time of each launch's processes: all 72 launches one after another took 863 core-seconds; with the
second runs side by side, about 975 (added up from the same measurement). These 34 (42 runs) add up to about
half of that.

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
