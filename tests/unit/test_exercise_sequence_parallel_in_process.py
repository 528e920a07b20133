"""Lesson 13's build exercise where no rank is launched: the block plan's skeleton is "not attempted", and a number
of ranks that does not divide the heads is refused (the launches: tests/process/test_exercise_sequence_parallel.py)."""
from __future__ import annotations

import inspect

import pytest

from fourcard_helpers import exercises
from fourcard_helpers.exercises import sequence_parallel_block
from fourcard_helpers.solutions import plans as reference
from helpers import write

SOLUTION = inspect.getsource(reference)
SKELETON = SOLUTION.split("    parts, whole")[0] + "    raise NotImplementedError\n"


def test_skeleton_is_not_attempted_without_a_launch(tmp_path):
    with pytest.raises(NotImplementedError, match="block_plan"):
        sequence_parallel_block.check(write(tmp_path, SKELETON, "my_block_plan.py"), nproc=2)
    assert "sequence-parallel-block" in exercises.catalog()


def test_a_number_of_ranks_that_does_not_divide_the_heads_is_refused_before_a_launch(tmp_path):
    with pytest.raises(ValueError, match="divides the 4 heads and the 8 positions .*; not 3"):
        sequence_parallel_block.check(write(tmp_path, SOLUTION, "my_block_plan.py"), nproc=3)
