"""Every notebook again, with another machine's rounding: the lessons' proofs must not depend on ours.

Float32 results depend on the CPU's vector width (ATen's kernels), oneDNN's choice of kernels and
the number of threads: a learner's laptop rounds differently from the machine the stored outputs
were made on, and training amplifies the difference. A proof that passes only here is not a proof.
So each notebook runs a second time under strict nbval with the plainest of each (two lessons at a
time, which the lessons must bear as they bear any busy machine):

* `ATEN_CPU_CAPABILITY=default`: ATen's kernels without AVX2/AVX-512;
* `ONEDNN_MAX_CPU_ISA=SSE41`: oneDNN's convolutions and matmuls limited to SSE4.1;
* `OMP_NUM_THREADS=1`: one thread, so sums are split (and rounded) differently.

The first test checks that each variable takes effect in this torch; the others rerun the lessons.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest

from test_notebooks import NOTEBOOKS

ROOT = NOTEBOOKS[0].parent.parent
ANOTHER_ROUNDING = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "OMP_NUM_THREADS": "1"}

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
        assert "capability DEFAULT" not in probe({"ONEDNN_MAX_CPU_ISA": "SSE41", "OMP_NUM_THREADS": "1"})


SIDE_BY_SIDE = 2  # notebooks run at once: a lesson's launches leave a core idle about a third of the time
Runs = dict[Path, "Future[subprocess.CompletedProcess[str]]"]  # each selected notebook's run, as it goes


def run_under_another_rounding(notebook: Path) -> subprocess.CompletedProcess[str]:
    """The notebook under strict nbval in a pytest of its own, with another rounding and a temporary
    folder of its own (lessons keep checkpoints there, and two lessons run at once); without pytest's
    cache, which two runs at once would both write."""
    with tempfile.TemporaryDirectory(prefix="fourcard-rounding-") as scratch:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(notebook.relative_to(ROOT))],
            cwd=ROOT, env={**os.environ, **ANOTHER_ROUNDING, "TMPDIR": scratch}, stdin=subprocess.DEVNULL,
            capture_output=True, text=True)


@pytest.fixture(scope="module")
def runs_under_another_rounding(request: pytest.FixtureRequest) -> Iterator[Runs]:
    """The run of every notebook whose test was selected, SIDE_BY_SIDE at a time from when the first test
    asks: each also meets a machine busy with another lesson, which no check of a lesson may mind (no
    assert is decided by speed)."""
    selected = [item.callspec.params["notebook"] for item in request.session.items  # nbval's cells too
                if isinstance(item, pytest.Function) and item.module is request.module and hasattr(item, "callspec")]
    with ThreadPoolExecutor(SIDE_BY_SIDE) as pool:
        yield {notebook: pool.submit(run_under_another_rounding, notebook) for notebook in selected}


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_the_notebook_passes_under_another_rounding(notebook: Path, runs_under_another_rounding: Runs) -> None:
    done = runs_under_another_rounding[notebook].result()
    assert done.returncode == 0, f"{notebook.name} under {ANOTHER_ROUNDING}:\n{done.stdout[-4000:]}"
