"""Every notebook again, with another machine's rounding: the lessons' proofs must not depend on ours.

Float32 results depend on the CPU's vector width (ATen's kernels), oneDNN's choice of kernels and
the number of threads: a learner's laptop rounds differently from the machine the stored outputs
were made on, and training amplifies the difference. A proof that passes only here is not a proof.
So each notebook runs a second time under strict nbval with the plainest of each (one lesson at a
time, in the background while the rest of the suite runs, which the lessons must bear as they bear
any busy machine):

* `ATEN_CPU_CAPABILITY=default`: ATen's kernels without AVX2/AVX-512;
* `ONEDNN_MAX_CPU_ISA=SSE41`: oneDNN's convolutions and matmuls limited to SSE4.1;
* `OMP_NUM_THREADS=1`: one thread, so sums are split (and rounded) differently.

The first test checks that each variable takes effect in this torch; the others collect the lessons'
runs, which tests/lessons/conftest.py starts in the background as soon as collection ends.

Lesson 12b, the practice SLURM cluster's, is the one lesson whose machinery depends on who runs it (its
daemons run as the learner, its shared files must be open to every user). Where the suite runs as root, as
CI does, its run here is also a learner's: as `nobody`, with a home and an environment of that user's own
(see venv_for_nobody in tests/helpers.py), so that root's run of the suite and this one cover both users, each in one
rounding. Both users in both roundings would take a third run of the lesson, about 100 s of CI's time.
Lesson 00's run is a learner's whole machine besides: their account, a home folder named with a space and
Chinese characters, a Chinese locale and one core (tests/lessons/test_hostile_conditions.py).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fourcard_helpers.rundir import THREADS_ENV
from helpers import ANOTHER_ROUNDING, NOTEBOOKS, cannot_run_here, needs_slurm

PROBE = """
import torch
print("capability", torch.backends.cpu.get_cpu_capability())
print("threads", torch.get_num_threads())
x, w = torch.randn(8, 16, 32, 32), torch.randn(32, 16, 3, 3)
with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
    torch.nn.functional.conv2d(x, w)  # oneDNN prints the instruction set it was allowed
"""


def probe(env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, **env}, capture_output=True,
                          text=True, check=True).stdout


@pytest.mark.slow
def test_each_variable_of_the_other_rounding_takes_effect() -> None:
    seen = probe(ANOTHER_ROUNDING)
    assert "capability DEFAULT" in seen
    assert "threads 1" in seen
    assert "isa:Intel SSE4.1" in seen
    if "DEFAULT" not in probe({}):  # on a machine whose own rounding is the plainest, nothing differs
        assert "capability DEFAULT" not in probe({"ONEDNN_MAX_CPU_ISA": "SSE41", THREADS_ENV: "1"})


@pytest.mark.slow
@pytest.mark.parametrize("notebook", [path for path in NOTEBOOKS if not cannot_run_here(path)], ids=lambda path: path.stem)
def test_the_notebook_passes_under_another_rounding(notebook: Path, under_another_rounding) -> None:
    done = under_another_rounding  # the lesson's run, started in the background when collection ended
    who = f" with {', '.join(done.machine)}" if done.machine else ""
    assert done.returncode == 0, f"{notebook.name} under {ANOTHER_ROUNDING}{who}:\n{done.output[-4000:]}"
    if done.as_learner and needs_slurm(notebook):  # lesson 12b: its cluster's folder and checkpoints are the learner's
        assert done.runs_owner == done.learner, done.runs_owner
