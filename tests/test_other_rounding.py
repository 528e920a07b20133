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

The first test checks that each variable takes effect in this torch; the others rerun the lessons.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import cannot_run_here
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


BACKGROUND_RUNS: dict[Path, "Future[subprocess.CompletedProcess[str]]"] = {}  # each selected lesson's run
_pool: ThreadPoolExecutor | None = None
_running: set[subprocess.Popen[str]] = set()


def run_under_another_rounding(notebook: Path) -> subprocess.CompletedProcess[str]:
    """The notebook under strict nbval in a pytest of its own, with another rounding, in a copy of the
    notebooks folder in a temporary folder of its own: lessons write beside themselves (saved scripts,
    `runs/`) and keep checkpoints in the temporary folder, while the rest of the suite, its own run of
    the same lesson included, goes on beside it. Without pytest's cache, which the suite's pytest writes."""
    with tempfile.TemporaryDirectory(prefix="fourcard-rounding-") as scratch:
        course = Path(scratch, "course")
        shutil.copytree(ROOT / "notebooks", course / "notebooks",
                        ignore=shutil.ignore_patterns("runs", ".ipynb_checkpoints", "__pycache__"))
        shutil.copy(ROOT / "pyproject.toml", course)  # pytest's options: nbval, the sanitize file
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"notebooks/{notebook.name}"]
        with subprocess.Popen(args, cwd=course, env={**os.environ, **ANOTHER_ROUNDING, "TMPDIR": scratch},
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) as proc:
            _running.add(proc)
            try:
                out, _ = proc.communicate()
            finally:
                _running.discard(proc)
        return subprocess.CompletedProcess(args, proc.returncode, out, "")


def start_in_background(notebooks: list[Path]) -> None:
    """Called (by conftest.py) as soon as collection ends: the selected lessons run one at a time beside
    the rest of the suite, whose launches leave a core idle a fair share of the time, and the tests
    below, ordered last, collect the verdicts. Each lesson thus also meets a machine busy with other
    tests, which no check of a lesson may mind (no assert is decided by speed)."""
    global _pool
    _pool = ThreadPoolExecutor(1, thread_name_prefix="other-rounding")
    BACKGROUND_RUNS.update({notebook: _pool.submit(run_under_another_rounding, notebook) for notebook in notebooks})


def stop_background() -> None:
    """At the session's end: a session stopped early (`-x`, a failure in collection) drops the lessons not
    yet started and interrupts the one running, whose pytest then shuts its kernel down as on Ctrl-C."""
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
    for proc in list(_running):
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.slow
@pytest.mark.background
@pytest.mark.parametrize("notebook", [path for path in NOTEBOOKS if not cannot_run_here(path)], ids=lambda path: path.stem)
def test_the_notebook_passes_under_another_rounding(notebook: Path) -> None:
    done = BACKGROUND_RUNS[notebook].result()
    assert done.returncode == 0, f"{notebook.name} under {ANOTHER_ROUNDING}:\n{done.stdout[-4000:]}"
