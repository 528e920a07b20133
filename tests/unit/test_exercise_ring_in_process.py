"""Lesson 06's build exercise where no rank is launched: its lengths include uneven ones and ones shorter than the
ring (the launches: tests/process/test_exercise_ring.py)."""
from __future__ import annotations

from fourcard_helpers.exercises import ring


def test_lengths_include_uneven_and_shorter_than_the_ring():
    for world in (2, 3, 4):
        assert 1 in ring.lengths(world) and any(n % world for n in ring.lengths(world) if n > 1)
        assert any(n % world == 0 for n in ring.lengths(world))
