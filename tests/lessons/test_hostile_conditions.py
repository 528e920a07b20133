"""Ordinary machines are not this one: the course must hold as a learner's machine is.

Each condition below is one a learner meets without doing anything unusual. Under all of them at once,
lesson 00 (cards, launches, results, a failing rank, nothing left behind, how a rank ends) runs top to
bottom under strict nbval, from a copy of the notebooks folder in that learner's home, in its run under
another rounding (tests/lessons/conftest.py: `learners_machine`), which a learner's machine also differs by:

* a learner's own account: an ordinary user, not root (as root, the run is `nobody`'s, with a virtual
  environment of that user's own where this environment's Python lies out of their reach, as a learner's
  own installation would provide it);
* a home folder whose path holds a space and Chinese characters (`我的 课程`);
* a Chinese locale (`LANG=zh_CN.UTF-8`);
* one core (`taskset -c 0`): four ranks and the kernel share it, and the run meets the rest of the suite
  on that core besides.

One run for all of them: each used to have a run of its own, which cost CI a lesson's run per condition;
where the run fails, nbval's report names the cell, and the cell's error what broke. A busy machine needs no
run of its own: every lesson's run under another rounding meets the rest of the suite beside it.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from helpers import ACCOUNT, ANOTHER_ROUNDING, HOME, LOCALE, NOTEBOOKS, ONE_CORE

LESSON = NOTEBOOKS[0]


@pytest.mark.slow
@pytest.mark.parametrize("notebook", [LESSON], ids=lambda path: path.stem)
def test_lesson_00_holds_on_a_learners_machine(notebook: Path, under_another_rounding: Any) -> None:
    done = under_another_rounding  # the lesson's run under another rounding, started when collection ended
    assert done.machine == (ACCOUNT, HOME, LOCALE, *([ONE_CORE] if shutil.which("taskset") else []))
    assert done.returncode == 0, (f"lesson 00 under {ANOTHER_ROUNDING} with {', '.join(done.machine)}:\n"
                                  f"{done.output[-4000:]}")
    assert done.as_learner == (os.geteuid() == 0)  # as root, the run was nobody's
