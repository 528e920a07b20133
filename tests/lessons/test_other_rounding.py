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

Lesson 12b, the practice SLURM cluster's, is the one lesson whose machinery depends on who runs it (its
daemons run as the learner, its shared files must be open to every user). Where the suite runs as root, as
CI does, its run here is also a learner's: as `nobody`, with a home and an environment of that user's own
(see _learners_python), so that root's run of the suite and this one cover both users, each in one
rounding. Both users in both roundings would take a third run of the lesson, about 100 s of CI's time.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import site
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import cannot_run_here
from helpers import NOTEBOOKS

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
RUNS_OWNER: dict[Path, int] = {}  # who owns the `runs` folder each lesson wrote: who ran it


AS_LEARNER = ["runuser", "-u", "nobody", "--"]  # as a login would: root's rights dropped


def runs_as_learner(notebook: Path) -> bool:
    """Whether this run of the lesson is an ordinary user's: lesson 12b's, where the suite runs as root."""
    needs = json.loads(notebook.read_text(encoding="utf-8"))["metadata"].get("fourcards", {}).get("needs")
    return needs == "slurm" and os.geteuid() == 0


def _learners_python(scratch: Path) -> str:
    """A Python environment the learner may run, with this one's packages. Lesson 12b's batch file activates
    the kernel's environment on every node, so it must be a virtual environment: this one where the learner
    may run its interpreter; where it lies in root's home, out of their reach, one made from the system's
    Python of the same version that imports this environment's packages, as a learner's own would."""
    if subprocess.run([*AS_LEARNER, sys.executable, "-c", "pass"], capture_output=True).returncode == 0:
        return sys.executable
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/bin:/usr/local/bin")
    if system is None:
        raise RuntimeError(f"lesson 12b as an ordinary user: this Python is out of that user's reach, and no system {version} exists")
    venv = scratch / "venv"
    subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    (site_packages,) = venv.glob("lib/python*/site-packages")
    (site_packages / "fourcards.pth").write_text(  # addsitedir: their own .pth files too (the course's editable install)
        "".join(f"import site; site.addsitedir({folder!r})\n" for folder in site.getsitepackages()))
    for program in Path(sys.prefix, "bin").iterdir():  # the packages' programs (torchrun, py-spy), as pip would install them
        own = venv / "bin" / program.name
        if own.exists() or own.is_symlink() or not program.is_file():
            continue
        text = program.read_bytes()
        if text.startswith(b"#!") and b"python" in text.split(b"\n", 1)[0]:  # a script: started by the learner's Python
            own.write_bytes(b"#!" + str(venv / "bin" / "python").encode() + b"\n" + text.split(b"\n", 1)[1])
            own.chmod(0o755)
        else:
            own.symlink_to(program)
    return str(venv / "bin" / "python")


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
        if runs_as_learner(notebook):  # HOME and TMPDIR of the learner's own; runuser would set HOME to nobody's
            home = Path(scratch, "home")
            home.mkdir()
            python = _learners_python(Path(scratch))
            for path in [Path(scratch), *Path(scratch).rglob("*")]:
                os.chown(path, *_nobody(), follow_symlinks=False)
            args = [*AS_LEARNER, "env", f"HOME={home}", f"TMPDIR={scratch}", python, *args[1:]]
        with subprocess.Popen(args, cwd=course, env={**os.environ, **ANOTHER_ROUNDING, "TMPDIR": scratch},
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) as proc:
            _running.add(proc)
            try:
                out, _ = proc.communicate()
            finally:
                _running.discard(proc)
        runs = course / "notebooks" / "runs"
        if runs.exists():
            RUNS_OWNER[notebook] = runs.stat().st_uid
        return subprocess.CompletedProcess(args, proc.returncode, out, "")


def _nobody() -> tuple[int, int]:
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


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
    who = " as an ordinary user (nobody)" if runs_as_learner(notebook) else ""
    assert done.returncode == 0, f"{notebook.name} under {ANOTHER_ROUNDING}{who}:\n{done.stdout[-4000:]}"
    if runs_as_learner(notebook):  # what the lesson wrote (its cluster's folder, checkpoints) is the learner's
        assert RUNS_OWNER.get(notebook) == _nobody()[0], RUNS_OWNER.get(notebook)
