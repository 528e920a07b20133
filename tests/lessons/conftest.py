"""What takes long and leaves cores idle runs in the background, beside the rest of the suite: each lesson
under another rounding, then the shipped scripts that tests/lessons/test_scripts.py launches with plain torchrun.

Each lesson runs a second time under strict nbval with another rounding (tests/lessons/test_other_rounding.py
says why), one lesson at a time, in a pytest of its own: about as long as the first run of every notebook.
Waiting for those runs after the suite, or running them as ordinary tests, would add that time to CI's;
started as soon as collection ends, they overlap the rest of the suite, whose launches leave a core idle a
fair share of the time. Each lesson thus also meets a machine busy with other tests, which no check of a
lesson may mind (no assert is decided by speed). Once they have ended, the same thread launches those scripts
as a learner would (tests/lessons/test_scripts.py): the suite's second half, alone on the machine,
kept its two cores only 60 to 80 % busy (a local run, /proc/stat read every 5 s, averaged over 5 minutes).

This small plugin does it for any test that asks for one of the fixtures in JOBS (`under_another_rounding`,
with the lesson as its parameter `notebook`; `launched_with_plain_torchrun`, with the script's launch as its
parameters; `under_this_rounding`, a lesson's strict nbval moved here from the suite's own lane,
tests/lessons/test_this_rounding.py): it starts the jobs of the selected tests when collection ends, in the order of those tests,
orders those tests last so that waiting for a job costs the suite as little as possible, gives each test its
job's result, and at the session's end stops what is still running. A job whose test was not selected is not
started (`pytest -m "not slow"`, `-k`), and `--collect-only` starts none.
"""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fourcard_helpers.lifecycle import GRACE_SECONDS, alive, descendants, stop
from fourcard_helpers.rundir import RENAMED, RUN_DIR_ENV
from helpers import (ACCOUNT, ANOTHER_ROUNDING, AS_NOBODY, BACKGROUND_THREADS, HOME, LEARNERS_HOME, LOCALE, LOCALE_NAME,
                     ONE_CORE, PLAIN_LAUNCHES, ROOT, SHARED_RUNS, TORCHRUN_CLOSE_SECONDS, launch_shipped_script, learners_machine, venv_for_nobody)


@dataclass(frozen=True)
class Verdict:
    """A lesson's run under another rounding: strict nbval's exit code and output; what of a learner's machine
    it met besides (`machine`); whether it ran as an ordinary user where the suite runs as root, and then who
    owns what the lesson wrote (its `runs` folder; in a home of its own, the scripts it saved, and where)."""
    returncode: int
    output: str
    machine: tuple[str, ...]
    as_learner: bool
    runs_owner: int | None
    saved: list[tuple[int, str]]
    learner: int


def run_in_a_copy(notebook: Path, rounding: Mapping[str, str], machine: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """The notebook under strict nbval in a pytest of its own, with `rounding`'s variables, in a copy of the
    notebooks folder in a temporary folder of its own: lessons write beside themselves (saved scripts,
    `runs/`) and keep checkpoints in the temporary folder, while the rest of the suite, its own run of
    the same lesson included, goes on beside it. Without pytest's cache, which the suite's pytest writes.
    The run meets `machine`, what of a learner's machine it must bear besides (learners_machine): with a home
    folder of its own, the copy lies in it, without the scripts the lesson saves, whose owner and place
    (SAVED) then show who ran the lesson, and where."""
    with tempfile.TemporaryDirectory(prefix="fourcard-rounding-") as scratch:
        as_learner = ACCOUNT in machine and os.geteuid() == 0
        home = Path(scratch, LEARNERS_HOME if HOME in machine else "home")
        course = home / "four-cards" if HOME in machine else Path(scratch, "course")
        saves = f"{notebook.stem.split('_')[0]}_*.py"  # the lesson's own scripts, which it writes again
        shutil.copytree(ROOT / "notebooks", course / "notebooks",
                        ignore=shutil.ignore_patterns("runs", "traces", ".ipynb_checkpoints", "__pycache__",
                                                      *([saves] if HOME in machine else [])))
        shutil.copy(ROOT / "pyproject.toml", course)  # pytest's options: nbval, the sanitize file
        env = {**SUITE_ENVIRONMENT, **rounding, "TMPDIR": scratch}
        for name in (RUN_DIR_ENV, RENAMED[RUN_DIR_ENV]):  # a learner's own run, even where the suite runs inside a launch
            env.pop(name, None)
        if HOME in machine or as_learner:
            home.mkdir(exist_ok=True)
            env["HOME"] = str(home)
        if LOCALE in machine:  # what decides the locale, LANG alone
            env = {name: value for name, value in env.items() if not name.startswith("LC_") and name != "LANGUAGE"}
            env["LANG"] = LOCALE_NAME
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"notebooks/{notebook.name}"]
        if as_learner:  # runuser would set HOME to nobody's: `env` gives the learner's folders again
            python = venv_for_nobody(Path(scratch))
            for path in [Path(scratch), *Path(scratch).rglob("*")]:
                os.chown(path, *_nobody(), follow_symlinks=False)
            args = [*AS_NOBODY, "env", *(f"{name}={env[name]}" for name in ("HOME", "TMPDIR", "LANG") if name in env),
                    python, *args[1:]]
        if ONE_CORE in machine:  # four ranks and the kernel on one core, as on a one-core virtual machine
            args = ["taskset", "-c", "0", *args]
        with subprocess.Popen(args, cwd=course, env=env,  # a group of its own, for lifecycle.stop
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True) as proc:
            _running.add(proc)
            try:
                out, _ = proc.communicate()
            finally:
                _running.discard(proc)
        runs = course / "notebooks" / "runs"
        if runs.exists():
            RUNS_OWNER[notebook] = runs.stat().st_uid
        if HOME in machine:
            SAVED[notebook] = [(path.stat().st_uid, str(path)) for path in sorted((course / "notebooks" / "scripts").glob(saves))]
        return subprocess.CompletedProcess(args, proc.returncode, out, "")


# The environment as the suite set it, before any test ran: a run starts while tests go on in the main thread,
# and a test that sets a variable for itself (monkeypatch: FOURCARDS_LANG=zh in test_chinese_launch.py) must not
# reach a lesson that starts just then (seen: lesson 13 under another rounding, begun during that test, in Chinese).
SUITE_ENVIRONMENT = dict(os.environ)


def _nobody() -> tuple[int, int]:
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


class BackgroundRuns:
    """The selected tests' jobs, one at a time in one thread, from the end of collection on."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=BACKGROUND_THREADS)
        self.runs: dict[tuple[str, Hashable], Future[Any]] = {}
        # Where a script's runs side by side wait, its threads started now: the unit tier lets a process be started
        # by the background threads that were there when its test began (tests/unit/conftest.py), and a script's
        # launch may come while a unit test runs (`pytest tests/unit tests/lessons/test_scripts.py`).
        self.side_by_side = ThreadPoolExecutor(SHARED_RUNS, thread_name_prefix=BACKGROUND_THREADS)
        all_there = threading.Barrier(SHARED_RUNS)
        list(self.side_by_side.map(lambda _: all_there.wait(), range(SHARED_RUNS)))
        self.stopping = threading.Event()  # set: no script's launch starts any more
        # the shipped scripts' temporary folders, one for each of the runs side by side, kept for every launch
        self.scratch = Path(tempfile.mkdtemp(prefix="fourcard-scripts-"))
        self.temp_dirs = [self.scratch / f"run{run}" for run in range(1, SHARED_RUNS + 1)]
        for folder in self.temp_dirs:
            folder.mkdir()

    def start(self, jobs: list[tuple[str, Hashable]]) -> None:
        """Queue each (fixture, its key) not queued yet, in this order."""
        for job in jobs:
            if job not in self.runs:
                fixture, key = job
                self.runs[job] = self.pool.submit(JOBS[fixture][1], self, key)

    def stop(self) -> None:
        """A session stopped early (`-x`, a failure in collection) drops the jobs not yet started and
        interrupts the lesson running, whose pytest then shuts its kernel down as on Ctrl-C, or stops the script's
        launch running. The scripts' temporary folders go."""
        self.stopping.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.side_by_side.shutdown(wait=False, cancel_futures=True)
        stop(list(_running), grace=KERNEL_SHUTDOWN_SECONDS, ask=signal.SIGINT)  # pytest's Ctrl-C: its kernel goes too
        # torchrun passes SIGTERM on to its ranks and ends them; an agent killed after its grace leaves them behind
        # (each rank is in a session of its own), so they are listed before the stop, as the launch's own stop does
        agents = list(PLAIN_LAUNCHES)
        ranks = descendants(agent.pid for agent in agents if agent.poll() is None)
        stop(agents, lambda: [pid for pid in ranks if alive(pid)], grace=TORCHRUN_CLOSE_SECONDS + GRACE_SECONDS)
        shutil.rmtree(self.scratch, ignore_errors=True)


_running: set[subprocess.Popen[str]] = set()
KERNEL_SHUTDOWN_SECONDS = 60  # how long a lesson's pytest gets, after Ctrl-C, to shut its kernel and launches down
RUNS_OWNER: dict[Path, int] = {}  # who owns the `runs` folder each lesson wrote: who ran it
SAVED: dict[Path, list[tuple[int, str]]] = {}  # the owner and path of each script a lesson in a home of its own saved
RUNS = pytest.StashKey[BackgroundRuns]()


def verdict(notebook: Path, rounding: Mapping[str, str] = ANOTHER_ROUNDING) -> Verdict:
    machine = learners_machine(notebook) if rounding else ()  # this machine's rounding: the suite's own conditions
    done = run_in_a_copy(notebook, rounding, machine)
    return Verdict(done.returncode, done.stdout, machine, ACCOUNT in machine and os.geteuid() == 0,
                   RUNS_OWNER.get(notebook), SAVED.get(notebook, []), _nobody()[0])


LAUNCH = ("script", "nproc", "nnodes", "timeout", "fails")  # test_scripts.py's parameters: one launch of a script

# A fixture a test asks for: the key of its job, from the test's parameters, and the job, run in the background.
JOBS: dict[str, tuple[Callable[[dict[str, Any]], Hashable], Callable[[BackgroundRuns, Any], Any]]] = {
    "under_another_rounding": (lambda params: params["notebook"], lambda runs, notebook: verdict(notebook)),
    "launched_with_plain_torchrun": (
        lambda params: tuple(params[name] for name in LAUNCH),
        # from the environment the suite started with, as a lesson's run above
        lambda runs, launch: launch_shipped_script(*launch, runs.temp_dirs, runs.side_by_side, runs.stopping, SUITE_ENVIRONMENT)),
    "under_this_rounding": (lambda params: params["notebook"], lambda runs, notebook: verdict(notebook, {})),
}


def _job(item: pytest.Item) -> tuple[str, Hashable] | None:
    """The background job `item` waits for, if any."""
    fixture = next((name for name in JOBS if name in getattr(item, "fixturenames", ())), None)
    return None if fixture is None else (fixture, JOBS[fixture][0](item.callspec.params))


@pytest.hookimpl(trylast=True)  # after -k and -m have chosen: only a job of a test still selected counts
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests that wait for a job go last, each job having had the rest of the suite to finish; their jobs
    start in that order: the lessons' runs under another rounding first, the slowest, then the scripts' launches,
    then the lessons whose nbval runs in the background (JOBS' order). A lesson whose run in this rounding is a
    job is not run again by the suite's own nbval (tests/lessons/test_this_rounding.py)."""
    in_background = {str(_job(item)[1]) for item in items if _job(item) is not None and _job(item)[0] == "under_this_rounding"}
    again = [item for item in items if type(item).__name__ == "IPyNbCell" and str(item.path) in in_background]
    if again:
        config.hook.pytest_deselected(items=again)
    waiting = sorted((item for item in items if _job(item) is not None), key=lambda item: list(JOBS).index(_job(item)[0]))
    deselected = set(map(id, again))
    items[:] = [item for item in items if _job(item) is None and id(item) not in deselected] + waiting


def pytest_collection_finish(session: pytest.Session) -> None:
    jobs = [job for item in session.items if (job := _job(item)) is not None]
    if jobs and not session.config.option.collectonly:
        session.config.stash[RUNS] = runs = BackgroundRuns()
        runs.start(jobs)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if RUNS in session.config.stash:
        session.config.stash[RUNS].stop()


def _result(request: pytest.FixtureRequest) -> Any:
    """The result of the job the requesting test waits for, queued now if collection did not queue it."""
    job = _job(request.node)
    assert job is not None
    if RUNS not in request.config.stash:  # collection started nothing: this test was run by itself
        request.config.stash[RUNS] = BackgroundRuns()
    runs = request.config.stash[RUNS]
    runs.start([job])  # nothing new where collection started it
    return runs.runs[job].result()


@pytest.fixture
def under_another_rounding(request: pytest.FixtureRequest, notebook: Path) -> Verdict:
    """The verdict of `notebook`'s run under another rounding, started when collection ended."""
    return _result(request)


@pytest.fixture
def under_this_rounding(request: pytest.FixtureRequest, notebook: Path) -> Verdict:
    """The verdict of `notebook`'s strict nbval in this machine's rounding, run in the background lane."""
    return _result(request)


@pytest.fixture
def launched_with_plain_torchrun(request: pytest.FixtureRequest, script: str, nproc: int, nnodes: int, timeout: float,
                                 fails: bool) -> list[tuple[list[int | None], str]]:
    """Each launch's agents' exit codes and output, of `script` launched as a learner would
    (helpers.launch_shipped_script), started when collection ended."""
    return _result(request)
