"""Lesson 08's build exercise where no rank is launched: the skeleton is "not attempted", and a world size that does
not divide the hidden width is refused, also on the terminal (the launches:
tests/process/test_exercise_tensor_parallel.py)."""
from __future__ import annotations

import inspect

import pytest

from fourcard_helpers import exercises
from fourcard_helpers.exercises import tensor_parallel
from fourcard_helpers.solutions import tensor_parallel as reference
from helpers import write

SOLUTION = inspect.getsource(reference)
SKELETON = SOLUTION.replace("        return F.linear(CopyToShards.apply(x), self.weight, self.bias)",
                            "        raise NotImplementedError")


def test_skeleton_is_not_attempted_without_a_launch(tmp_path):
    with pytest.raises(NotImplementedError):
        tensor_parallel.check(write(tmp_path, SKELETON, "my_tensor_parallel.py"), nproc=2)


def test_a_world_size_that_does_not_divide_the_hidden_width_is_refused_before_a_launch(tmp_path, capsys):
    with pytest.raises(ValueError, match="divides the hidden width 16 .*; not 3"):
        tensor_parallel.check(write(tmp_path, SOLUTION, "my_tensor_parallel.py"), nproc=3)
    # the terminal's check says so as a usage error (exit 2), not a traceback
    answer = write(tmp_path, SOLUTION, "my_tensor_parallel.py")
    assert exercises.main(["tensor-parallel-mlp", str(answer), "--nproc", "3"]) == 2
    assert "not 3" in capsys.readouterr().err
