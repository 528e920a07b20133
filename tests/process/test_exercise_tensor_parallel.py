"""Lesson 08's build exercise, f and g as autograd functions and the column- and row-parallel layers:
the reference passes, and each mistake is named from the numbers the ranks found (real torchrun, gloo)."""
from __future__ import annotations

import inspect

import pytest

from fourcard_helpers.check import CheckFailed
from fourcard_helpers.exercises import tensor_parallel
from fourcard_helpers.solutions import tensor_parallel as reference
from helpers import mistake, write

ANSWER = "my_tensor_parallel.py"   # the file the learner's answer is in

SOLUTION = inspect.getsource(reference)


BOTH_DIRECTIONS = mistake(SOLUTION, "    def backward(ctx, grad):\n        return grad\n",
                          "    def backward(ctx, grad):\n        grad = grad.contiguous()\n"
                          "        dist.all_reduce(grad)\n        return grad\n")
NO_BACKWARD_REDUCE = mistake(SOLUTION, "        grad = grad.contiguous()\n        dist.all_reduce(grad)\n        return grad\n",
                             "        return grad\n")
WRONG_DIMENSION = mistake(SOLUTION, "dense.weight.detach().chunk(world, dim=0)[rank]", "dense.weight.detach().chunk(world, dim=1)[rank]")
BIAS_ON_EVERY_RANK = mistake(SOLUTION, "return ReduceFromShards.apply(F.linear(x_slice, self.weight)) + self.bias",
                             "return ReduceFromShards.apply(F.linear(x_slice, self.weight, self.bias))")


@pytest.mark.slow
def test_reference_passes_with_one_all_reduce_each_way(tmp_path):
    verdict = tensor_parallel.check(write(tmp_path, SOLUTION, ANSWER), nproc=4)
    assert "one all_reduce of 5 × 12 numbers forward and one backward" in verdict


@pytest.mark.slow
@pytest.mark.parametrize("text, named", [
    (BOTH_DIRECTIONS, "exactly 2 × the dense ones"),
    (NO_BACKWARD_REDUCE, "each rank's gradient of x is a partial sum"),
    (WRONG_DIMENSION, "your ColumnParallelLinear keeps weight (16, 6)"),
    (BIAS_ON_EVERY_RANK, "plus exactly 1 × fc2's bias"),
], ids=["all-reduce-both-ways", "no-backward-all-reduce", "wrong-dimension", "bias-on-every-rank"])
def test_each_mistake_is_named(tmp_path, text, named):
    with pytest.raises(CheckFailed, match=named.replace("(", r"\(").replace(")", r"\)")) as failure:
        tensor_parallel.check(write(tmp_path, text, ANSWER), nproc=2)
    print(failure.value)
