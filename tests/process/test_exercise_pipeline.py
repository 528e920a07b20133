"""Lesson 07's build exercise, the 1F1B schedule with send/recv: the reference passes, and each mistake is
named from what the stages did (real torchrun launches on gloo)."""
from __future__ import annotations

import inspect

import pytest

from fourcard_helpers.check import CheckFailed
from fourcard_helpers.exercises import pipeline
from fourcard_helpers.solutions import pipeline as reference
from helpers import mistake, write

ANSWER = "my_pipeline.py"   # the file the learner's answer is in

SOLUTION = inspect.getsource(reference)


GPIPE = mistake(SOLUTION, "    warmup = min(world - 1 - rank, micro_batches)", "    warmup = micro_batches")
UNSCALED = mistake(SOLUTION, "y = loss_fn(y, ts[i]) / micro_batches", "y = loss_fn(y, ts[i])")
SKIPPED_SEND = mistake(SOLUTION, "        return None if first else x.grad ", "        return None if first or i == micro_batches - 1 else x.grad ")


@pytest.mark.slow
def test_reference_passes_in_1f1b_order(tmp_path):
    verdict = pipeline.check(write(tmp_path, SOLUTION, ANSWER), nproc=4)
    assert "at most [4, 3, 2, 1] micro-batches' activations" in verdict


@pytest.mark.slow
@pytest.mark.parametrize("text, named", [
    (GPIPE, "stage 0 runs every forward before any backward (GPipe's order): with 4 micro-batches it holds 4"),
    (UNSCALED, "every gradient is exactly 4 × one card's"),
    (SKIPPED_SEND, "stage 0 waits for gradient number 4 from stage 1, which posted only 3 sends to it"),
], ids=["gpipe-order", "not-scaled", "skipped-send"])
def test_each_mistake_is_named(tmp_path, text, named):
    with pytest.raises(CheckFailed, match=named.replace("(", r"\(").replace(")", r"\)")) as failure:
        pipeline.check(write(tmp_path, text, ANSWER), nproc=2, seconds=3.0)
    print(failure.value)
