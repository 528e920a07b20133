"""Lesson 06's build exercise where no rank is launched: its lengths include uneven ones and ones shorter than the
ring (the launches: tests/process/test_exercise_ring.py)."""
from __future__ import annotations

import pytest

from fourcard_helpers.exercises import ring
from helpers import write

SKELETON = ("import torch\nimport torch.distributed as dist\n\n"
            "def ring_all_reduce(tensor):\n    # your code here\n    raise NotImplementedError\n")


def test_lengths_include_uneven_and_shorter_than_the_ring():
    for world in (2, 3, 4):
        assert 1 in ring.lengths(world) and any(n % world for n in ring.lengths(world) if n > 1)
        assert any(n % world == 0 for n in ring.lengths(world))


def test_skeleton_is_not_attempted_without_a_launch(tmp_path):
    with pytest.raises(NotImplementedError):
        ring.check(write(tmp_path, SKELETON, "my_ring.py"), nproc=2)
