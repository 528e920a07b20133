"""Lesson 07's build exercise where no rank is launched: its cases have more and fewer micro-batches than stages
(the launches: tests/process/test_exercise_pipeline.py)."""
from __future__ import annotations

from fourcard_helpers.exercises import pipeline


def test_cases_have_more_and_fewer_micro_batches_than_stages():
    for stages in (2, 3, 4):
        assert max(pipeline.cases(stages)) > stages and min(pipeline.cases(stages)) < stages
