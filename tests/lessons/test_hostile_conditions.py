"""Ordinary machines are not this one: the course must hold as a learner's machine is.

Each condition below is one a learner meets without doing anything unusual. Under each, lesson 00
(cards, launches, results, a failing rank, nothing left behind, how a rank ends) runs top to bottom
under strict nbval, from a copy of the notebooks folder in that learner's home:

* a learner's own account, three conditions in one run (each changes a different thing, and the
  message of a failure shows which part broke): an ordinary user, not root (as root, the test runs
  it as `nobody`; where this environment's Python lies in root's home, out of that user's reach,
  the user runs the system's Python of the same version with this environment's packages, as a
  learner's own installation would provide them), a home folder whose path holds a space and
  Chinese characters, and a Chinese locale (`LANG=zh_CN.UTF-8`);
* one core (`taskset -c 0`): four ranks and the kernel share it.

A busy machine has no run of its own: the one-core run is one (five busy processes on a core), and every
lesson's run under another rounding meets the rest of the suite beside it (tests/lessons/conftest.py).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fourcard_helpers.rundir import PYTHONPATH_ENV, RUN_DIR_ENV
from helpers import AS_NOBODY, NOTEBOOKS, python_for_nobody

LESSON = NOTEBOOKS[0]
CONDITIONS = ["learner's account", "one core"]


@pytest.mark.slow
@pytest.mark.parametrize("condition", CONDITIONS)
def test_lesson_00_holds(condition: str) -> None:
    if condition == "one core" and not shutil.which("taskset"):
        pytest.skip("taskset (util-linux) is not installed")
    root = Path(tempfile.mkdtemp(prefix="fourcard-learner-"))
    home = root / ("我的 课程" if condition == "learner's account" else "home")
    copy = home / "four-cards" / "notebooks"
    shutil.copytree(LESSON.parent, copy, ignore=shutil.ignore_patterns("runs", "traces", ".ipynb_checkpoints"))
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(root)}
    env.pop(RUN_DIR_ENV, None)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(copy), "-o", "addopts=",
               "--nbval", "--nbval-current-env", "--nbval-sanitize-with", str(copy / "sanitize.cfg"),
               "--nbval-cell-timeout=300", str(copy / LESSON.name)]
    if condition == "learner's account":
        env["LANG"] = "zh_CN.UTF-8"
        if os.geteuid() == 0:
            shutil.chown(root, "nobody", "nogroup")
            for path in root.rglob("*"):
                shutil.chown(path, "nobody", "nogroup")
            python = python_for_nobody(env)  # runuser sets HOME to nobody's own: give it the learner's folders again
            keep = [f"{name}={env[name]}" for name in ("HOME", "TMPDIR", PYTHONPATH_ENV, "LANG") if name in env]
            command = [*AS_NOBODY, "env", *keep, python, *command[1:]]
    elif condition == "one core":
        command = ["taskset", "-c", "0", *command]
    try:
        done = subprocess.run(command, cwd=copy, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert done.returncode == 0, f"lesson 00 with {condition}:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
