"""The lessons under another rounding run in the background, beside the rest of the suite.

Each lesson runs a second time under strict nbval with another rounding (tests/lessons/test_other_rounding.py
says why), one lesson at a time, in a pytest of its own: about as long as the first run of every notebook.
Waiting for those runs after the suite, or running them as ordinary tests, would add that time to CI's;
started as soon as collection ends, they overlap the rest of the suite, whose launches leave a core idle a
fair share of the time. Each lesson thus also meets a machine busy with other tests, which no check of a
lesson may mind (no assert is decided by speed).

This small plugin does it for any test that asks for the fixture `under_another_rounding` (with the lesson
as its parameter `notebook`): it starts the runs of the selected tests when collection ends, orders those
tests last so that waiting for a run costs the suite as little as possible, gives each test its lesson's
verdict, and at the session's end stops what is still running. A run whose test was not selected is not
started (`pytest -m "not slow"`, `-k`), and `--collect-only` starts none.
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
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import ANOTHER_ROUNDING, BACKGROUND_THREADS, ROOT

FIXTURE = "under_another_rounding"


@dataclass(frozen=True)
class Verdict:
    """A lesson's run under another rounding: strict nbval's exit code and output; whether it ran as an
    ordinary user (lesson 12b where the suite runs as root), and then who owns what the lesson wrote."""
    returncode: int
    output: str
    as_learner: bool
    runs_owner: int | None
    learner: int


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
        with subprocess.Popen(args, cwd=course, env={**SUITE_ENVIRONMENT, **ANOTHER_ROUNDING, "TMPDIR": scratch},
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


# The environment as the suite set it, before any test ran: a run starts while tests go on in the main thread,
# and a test that sets a variable for itself (monkeypatch: FOURCARDS_LANG=zh in test_chinese_launch.py) must not
# reach a lesson that starts just then (seen: lesson 13 under another rounding, begun during that test, in Chinese).
SUITE_ENVIRONMENT = dict(os.environ)


def _nobody() -> tuple[int, int]:
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


class BackgroundRuns:
    """The selected lessons' runs, one at a time in one thread, from the end of collection on."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=BACKGROUND_THREADS)
        self.runs: dict[Path, Future[Verdict]] = {}

    def start(self, notebooks: list[Path]) -> None:
        for notebook in notebooks:
            if notebook not in self.runs:
                self.runs[notebook] = self.pool.submit(verdict, notebook)

    def stop(self) -> None:
        """A session stopped early (`-x`, a failure in collection) drops the lessons not yet started and
        interrupts the one running, whose pytest then shuts its kernel down as on Ctrl-C."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        for proc in list(_running):
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


_running: set[subprocess.Popen[str]] = set()
RUNS_OWNER: dict[Path, int] = {}  # who owns the `runs` folder each lesson wrote: who ran it
RUNS = pytest.StashKey[BackgroundRuns]()


def verdict(notebook: Path) -> Verdict:
    done = run_under_another_rounding(notebook)
    return Verdict(done.returncode, done.stdout, runs_as_learner(notebook), RUNS_OWNER.get(notebook), _nobody()[0])


def _waiting(item: pytest.Item) -> bool:
    return FIXTURE in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that wait for a run go last, each run having had the rest of the suite to finish."""
    items[:] = [item for item in items if not _waiting(item)] + [item for item in items if _waiting(item)]


def pytest_collection_finish(session: pytest.Session) -> None:
    notebooks = [item.callspec.params["notebook"] for item in session.items if _waiting(item)]
    if notebooks and not session.config.option.collectonly:
        session.config.stash[RUNS] = runs = BackgroundRuns()
        runs.start(notebooks)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if RUNS in session.config.stash:
        session.config.stash[RUNS].stop()


@pytest.fixture
def under_another_rounding(request: pytest.FixtureRequest, notebook: Path) -> Verdict:
    """The verdict of `notebook`'s run under another rounding, started when collection ended."""
    runs = request.config.stash.setdefault(RUNS, BackgroundRuns())
    runs.start([notebook])  # nothing new where collection started it
    return runs.runs[notebook].result()
