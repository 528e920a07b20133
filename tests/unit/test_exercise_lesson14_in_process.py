"""Lesson 14's build exercises where no rank is launched: the ring-attention skeleton is "not attempted", and an
expert dispatch is refused a world size that does not divide the experts (the launches:
tests/process/test_exercise_lesson14.py)."""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from fourcard_helpers.exercises import expert_dispatch, ring_attention
from fourcard_helpers.solutions import experts
from helpers import write

SKELETON = "import torch\nimport torch.distributed as dist\n\n\ndef ring_attention(q, k, v):\n" \
           "    # your code here\n    raise NotImplementedError\n"


def test_ring_attention_skeleton_is_not_attempted_without_a_launch(tmp_path: Path) -> None:
    with pytest.raises(NotImplementedError, match="ring_attention"):
        ring_attention.check(write(tmp_path, SKELETON, "my_ring_attention.py"), nproc=2)


def test_expert_dispatch_refuses_a_world_size_that_does_not_divide_the_experts_before_a_launch(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="divides its 8 experts .*; not 3"):
        expert_dispatch.check(write(tmp_path, inspect.getsource(experts), "my_expert_dispatch.py"), nproc=3)
