"""Ordinary machines are not this one: the course must hold as a learner's machine is.

Each condition below is one a learner meets without doing anything unusual. Under all of them at once,
lesson 00 (cards, launches, results, a failing rank, nothing left behind, how a rank ends) runs top to
bottom under strict nbval in its run under another rounding, which a learner's machine also differs by
(`learners_machine` in tests/helpers.py; the run: tests/lessons/conftest.py):

* a learner's own account: an ordinary user, not root (as root, the run is `nobody`'s, with a virtual
  environment of that user's own where this environment's Python lies out of their reach, as a learner's
  own installation would provide it);
* a home folder whose path holds a space and Chinese characters (`我的 课程`), where the copy of the
  notebooks folder lies;
* a Chinese locale (`LANG=zh_CN.UTF-8`, no other locale setting; .ci/run generates it);
* one core (`taskset -c 0`): four ranks and the kernel share it, beside the rest of the suite.

One run for all of them, because CI is bound by CPU work: each used to have a run of its own, in this
machine's rounding, a lesson's run more per condition. A failure no longer says which condition broke it;
the failing cell, under nbval, says where to look. Lesson 00's run in this machine's rounding is root's (in
CI) on every core, as the rest of the suite is. A busy machine needs no run of its own: every lesson's run
under another rounding meets the rest of the suite beside it.

The lesson's exit code is test_other_rounding.py's to judge; here, what shows that the run was the learner's:
the scripts the lesson saved (left out of the copy, so that the run writes them afresh) lie in that home,
and belong to `nobody` where the suite runs as root.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from helpers import ACCOUNT, HOME, LEARNERS_HOME, LOCALE, NOTEBOOKS, ONE_CORE, missing_for_a_learners_machine

LESSON = NOTEBOOKS[0]


@pytest.mark.slow
@pytest.mark.parametrize("notebook", [LESSON], ids=lambda path: path.stem)
def test_lesson_00_ran_on_a_learners_machine(notebook: Path, under_another_rounding: Any) -> None:
    done = under_another_rounding  # the lesson's run under another rounding, started when collection ended
    if missing := missing_for_a_learners_machine():
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"this machine lacks {', '.join(missing.values())}")
    assert done.machine == (ACCOUNT, HOME, LOCALE, ONE_CORE)
    if done.returncode != 0:
        pytest.fail("lesson 00's run failed: test_other_rounding.py shows how", pytrace=False)
    assert done.saved, "lesson 00 saved no script in the learner's copy"
    for owner, path in done.saved:
        assert f"/{LEARNERS_HOME}/four-cards/notebooks/scripts/" in path, path
        assert owner == (done.learner if os.geteuid() == 0 else os.geteuid()), (path, owner)
