"""The unit tier starts no process: no subprocess, no torchrun, no kernel, no fork or spawn.

That is what makes it the tier a contributor runs after every change (`pytest tests/unit`): its tests
call the course's code in this process, and take well under a minute together. A test that needs a
process belongs in tests/process (launches, warm sessions, the practice cluster, kernels, a browser)
or tests/lessons (the lessons' scripts and notebooks run again).

The promise is checked on every run, not kept by hand: while a test of this folder runs, fixtures
included, every way Python has to start a process raises, naming what was called and where the test
belongs, and the test fails even where the code under test catches that error. One kind of thread is
not the test's and passes: in a run of the whole suite, the background jobs (tests/lessons/conftest.py:
the lessons under another rounding, then the shipped scripts' launches, in threads named
BACKGROUND_THREADS... that were there when the test began) go on beside it; any other thread, left by an
earlier test or started by this one, meets the gates too.
tests/unit/test_unit_tier.py shows that the gates catch what they promise to.
"""
from __future__ import annotations

import _posixsubprocess
import multiprocessing.process
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import BACKGROUND_THREADS  # the thread_name_prefix of the background jobs (tests/lessons/conftest.py)

HERE = Path(__file__).resolve().parent
MOVE_IT = "tests/unit starts no process; a test that needs one belongs in tests/process or tests/lessons"
ATTEMPTS = pytest.StashKey[list[str]]()

# Every way to a new process passes one of these: subprocess (asyncio's, os.popen and Jupyter's kernel
# start included) through Popen to fork_exec or os.posix_spawn; multiprocessing through Process.start to
# os.fork (fork) or fork_exec (spawn, forkserver); os.system, os.spawn* and the exec family their own way.
GATES: list[tuple[Any, str]] = [
    (subprocess.Popen, "__init__"),
    *[(subprocess, name) for name in ("_fork_exec",) if hasattr(subprocess, name)],  # Python 3.11 and newer
    (_posixsubprocess, "fork_exec"),
    (multiprocessing.process.BaseProcess, "start"),
    *[(os, name) for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "spawnv", "spawnve",
                              "spawnvp", "spawnvpe", "execv", "execve") if hasattr(os, name)],
]


class ProcessStarted(RuntimeError):
    """A test of the unit tier tried to start a process."""


def _gate(label: str, original: Callable[..., Any], attempts: list[str],
          others: set[threading.Thread]) -> Callable[..., Any]:
    def shut(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() in others:  # the very thread object, not an id a new thread may reuse
            return original(*args, **kwargs)
        attempts.append(label)
        raise ProcessStarted(f"{label} was called: {MOVE_IT}")
    return shut


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Setup, call and teardown of each test of this folder run with every gate shut."""
    if not item.path.is_relative_to(HERE):  # this hook sees every test of the session
        yield
        return
    attempts: list[str] = []
    item.stash[ATTEMPTS] = attempts
    others = {thread for thread in threading.enumerate() if thread.name.startswith(BACKGROUND_THREADS)}
    with pytest.MonkeyPatch.context() as patch:
        for owner, name in GATES:
            label = f"{getattr(owner, '__qualname__', getattr(owner, '__name__', '?'))}.{name}"
            patch.setattr(owner, name, _gate(label, getattr(owner, name), attempts, others))
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test that tried to start a process fails, whether or not the error reached pytest."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    attempts = item.stash.get(ATTEMPTS, None)
    if attempts and report.passed:
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid} tried to start a process ({', '.join(sorted(set(attempts)))}): {MOVE_IT}"
    if attempts:
        attempts.clear()  # reported, by the error it raised or here: the next phase starts afresh
