"""Lesson 07's build exercise where no rank is launched: its cases have more and fewer micro-batches than stages
(the launches: tests/process/test_exercise_pipeline.py)."""
from __future__ import annotations

import inspect

import pytest

from fourcard_helpers.exercises import pipeline
from fourcard_helpers.solutions import pipeline as reference
from helpers import write

SKELETON = inspect.getsource(reference).replace('    """One training step',
                                                '    raise NotImplementedError\n    """One training step')


def test_cases_have_more_and_fewer_micro_batches_than_stages():
    for stages in (2, 3, 4):
        assert max(pipeline.cases(stages)) > stages and min(pipeline.cases(stages)) < stages


def test_skeleton_is_not_attempted_without_a_launch(tmp_path):
    with pytest.raises(NotImplementedError):
        pipeline.check(write(tmp_path, SKELETON, "my_pipeline.py"), nproc=2)
