"""Lesson 10's build exercise where no rank is launched: the cuts of the gradient are uneven, with empty pieces, and
the skeleton is "not attempted" (the launches: tests/process/test_exercise_clipping.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from fourcard_helpers import exercises
from fourcard_helpers.exercises import sharded_clip


def test_the_cuts_are_uneven_with_empty_pieces() -> None:
    for world in (2, 4):
        pieces = [b - a for a, b in zip(sharded_clip.cuts(3, world), sharded_clip.cuts(3, world)[1:])]
        assert sum(pieces) == 3 and 0 in pieces
        sizes = {b - a for a, b in zip(sharded_clip.cuts(144, world), sharded_clip.cuts(144, world)[1:])}
        assert len(sizes) == world


def test_the_skeleton_is_not_attempted_without_a_launch(tmp_path: Path) -> None:
    skeleton = tmp_path / "my_clip.py"
    skeleton.write_text("import torch\n\n\ndef clip_sharded_grad_norm_(shards, max_norm, group=None):\n"
                        "    # your code here\n    raise NotImplementedError\n", encoding="utf-8")
    with pytest.raises(NotImplementedError, match="clip_sharded_grad_norm_"):
        exercises.run("sharded-clip", skeleton)
