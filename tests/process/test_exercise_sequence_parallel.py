"""Lesson 13's build exercise, the tensor + sequence parallel plan of a GPT block: the reference passes, and each
mistake is named from what the ranks found (real torchrun, gloo, two ranks: the diagnoses are the same as on four).
What needs no launch: tests/unit/test_exercise_sequence_parallel_in_process.py."""
from __future__ import annotations

import inspect

import pytest

from fourcard_helpers.check import CheckFailed
from fourcard_helpers.exercises import sequence_parallel_block
from fourcard_helpers.solutions import plans as reference
from helpers import mistake, write

ANSWER = "my_block_plan.py"   # the file the learner's answer is in

SOLUTION = inspect.getsource(reference)


NO_SEQUENCE_PARALLEL_NORMS = mistake(SOLUTION, '        "attention_norm": SequenceParallel(),   # each card normalises its part '
                                     'of the positions\n        "mlp_norm": SequenceParallel(),\n', "")
ROW_PLANNED_AS_COLUMN = mistake(SOLUTION, '"attention.wo": RowwiseParallel(output_layouts=Shard(1)),', '"attention.wo": ColwiseParallel(),')
WHOLE_SEQUENCE_OUT = SOLUTION.replace("RowwiseParallel(output_layouts=Shard(1))", "RowwiseParallel()")
NO_GATHER_BEFORE_ATTENTION = mistake(SOLUTION, 
    '        "attention": PrepareModuleInput(input_layouts=parts, desired_input_layouts=whole),   # one all-gather\n', "")
INPUT_DECLARED_WHOLE = (SOLUTION.replace("PrepareModuleInput(input_layouts=parts,", "PrepareModuleInput(input_layouts=whole,")
                        .replace("SequenceParallel(),", "SequenceParallel(use_local_output=True),"))   # plain parts
IMPORTS = ("from torch.distributed.tensor import Replicate, Shard\nfrom torch.distributed.tensor.parallel import "
           "ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel\n\n\n")
EXPLICIT_LAYOUTS = IMPORTS + """def block_plan():   # every layout spelled out, bare placements rather than tuples
    col = lambda: ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=True)
    row = lambda: RowwiseParallel(input_layouts=Shard(-1), output_layouts=Shard(1), use_local_output=True)
    gather = lambda: PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate(),
                                        use_local_output=False)
    return {"attention_norm": SequenceParallel(sequence_dim=1), "mlp_norm": SequenceParallel(sequence_dim=1),
            "attention": gather(), "mlp": gather(),
            "attention.wq": col(), "attention.wk": col(), "attention.wv": col(), "mlp.w1": col(),
            "attention.wo": row(), "mlp.w2": row()}
"""
LOCAL_NORMS_IN_A_LOOP = IMPORTS + """def block_plan():   # the norms hand on plain tensors, layouts in lists, keys in another order
    plan = {}
    for sub, first, last in (("mlp", ["w1"], "w2"), ("attention", ["wq", "wk", "wv"], "wo")):
        plan[f"{sub}.{last}"] = RowwiseParallel(output_layouts=Shard(1))
        for name in first:
            plan[f"{sub}.{name}"] = ColwiseParallel()
        plan[sub] = PrepareModuleInput(input_layouts=[Shard(1)], desired_input_layouts=[Replicate()])
        plan[f"{sub}_norm"] = SequenceParallel(use_local_output=True)
    return plan
"""


@pytest.mark.slow
def test_reference_passes_with_one_gather_and_one_scatter_per_sub_layer(tmp_path):
    verdict = sequence_parallel_block.check(write(tmp_path, SOLUTION, ANSWER), nproc=2)
    assert "equal one card's in float64" in verdict
    assert "6 all_gather_into_tensor, 1 all_reduce, 4 reduce_scatter_tensor in forward" in verdict


@pytest.mark.slow
@pytest.mark.parametrize("text", [EXPLICIT_LAYOUTS, LOCAL_NORMS_IN_A_LOOP], ids=["explicit-layouts", "local-norms"])
def test_other_right_plans_pass(tmp_path, text):
    verdict = sequence_parallel_block.check(write(tmp_path, text, ANSWER), nproc=2)
    assert "5 all_gather_into_tensor, 5 reduce_scatter_tensor in backward" in verdict


@pytest.mark.slow
@pytest.mark.parametrize("text, named", [
    (NO_SEQUENCE_PARALLEL_NORMS, "plan the norms SequenceParallel()"),
    (ROW_PLANNED_AS_COLUMN, "attention.wo holds (8, 16) of its (16, 16) weight on every rank (its output features "
                            "split: ColwiseParallel)"),
    (WHOLE_SEQUENCE_OUT, "attention returned (2, 8, 16) on each rank where the residual stream holds (2, 4, 16)"),
    (NO_GATHER_BEFORE_ATTENTION, "forward called 10 all_gather_into_tensor, 1 all_reduce, 4 reduce_scatter_tensor "
                                 "where the plan calls 6"),
    (INPUT_DECLARED_WHOLE, "attention returned (2, 2, 16) on rank 0 where the residual stream holds (2, 4, 16): its "
                           "input was declared whole (Replicate())"),
], ids=["norms-not-sequence-parallel", "row-layer-as-column", "whole-sequence-out", "no-gather-before-attention",
        "input-declared-whole"])
def test_each_mistake_is_named(tmp_path, text, named):
    with pytest.raises(CheckFailed) as failure:
        sequence_parallel_block.check(write(tmp_path, text, ANSWER), nproc=2)
    assert named in str(failure.value), str(failure.value)
