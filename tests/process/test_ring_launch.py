"""Lesson 14's rings, launched: a block whose layout is transposed travels
round the ring and its gradient back (gloo refuses to receive into memory that is not contiguous); and what a
context-parallel rank holds at its peak is the lesson's prediction to the byte, which a prediction that forgets the
loss's tensors, or a ring that keeps one block more, fails."""
from __future__ import annotations

import ast

import pytest
import torch

from helpers import NOTEBOOKS, cells, source

LESSON = next(p for p in NOTEBOOKS if p.stem == "14_long_sequences_and_experts")
SCRIPT = LESSON.parent / "scripts" / "14_gpt_context_parallel.py"


TRANSPOSED = """
import torch
import torch.distributed as dist

from fourcard_helpers import exit_without_teardown, report
from fourcard_helpers.ring import RingShift, pass_round
dist.init_process_group("gloo")
rank = dist.get_rank()
block = (torch.arange(12.0) + 100 * rank).view(3, 4).t()   # transposed, as q, k, v are in lesson 14's GPT
arrived = pass_round(block)()
leaf = block.clone().requires_grad_()
weights = torch.arange(12.0).view(4, 3) + 10 * rank
(RingShift.apply(leaf).t() * weights.t()).sum().backward()   # the gradient reaching the shift is transposed too
report(arrived=arrived.tolist(), contiguous=arrived.is_contiguous(), grad=leaf.grad.tolist())
dist.destroy_process_group()
exit_without_teardown()
"""


@pytest.mark.slow
def test_a_transposed_block_travels_round_the_ring_and_its_gradient_back() -> None:
    from fourcard_helpers.launch import leftover_processes, torchrun

    reports = torchrun(TRANSPOSED, nproc=2, timeout=120, echo=False).reports
    assert leftover_processes() == []
    for rank in (0, 1):
        other = 1 - rank
        assert reports[rank]["contiguous"]
        assert reports[rank]["arrived"] == (torch.arange(12.0) + 100 * other).view(3, 4).t().tolist()
        # forward sent this rank's block on; backward brings back the gradient of the rank it went to
        assert reports[rank]["grad"] == (torch.arange(12.0).view(4, 3) + 10 * other).tolist()


def lesson_function(name: str):
    """A function the lesson defines in its own cells, run here as the lesson runs it."""
    for cell in cells(LESSON):
        text = source(cell)
        if cell["cell_type"] != "code" or text.startswith("%"):
            continue
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                namespace: dict = {}
                exec(ast.get_source_segment(text, node), namespace)  # noqa: S102 - the lesson's own definition
                return namespace[name]
    raise AssertionError(f"lesson 14 defines no function {name!r}")


@pytest.mark.slow
def test_a_context_parallel_ranks_peak_is_the_prediction_and_not_a_wrong_one() -> None:
    """Section 3's launch on two ranks, so 256 tokens a rank where the lesson has 128: the prediction holds to the byte
    at another size; without the loss's tensors, or against a ring that kept one block of keys and values more, the
    lesson's check fails."""
    from fourcard_helpers.gpt import GPT, GPTConfig, poem_tokens
    from fourcard_helpers.launch import leftover_processes, torchrun

    reports = torchrun(SCRIPT.read_text(encoding="utf-8"), nproc=2, timeout=300, echo=False).reports
    assert leftover_processes() == []
    terms, check_rank_peak = lesson_function("rank_peak_terms"), lesson_function("check_rank_peak")
    _, chars = poem_tokens()
    model = GPT(GPTConfig(vocab_size=len(chars), block_size=512))
    weights = 8 * sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    tokens, width, blocks, heads = 256, 64, 2, 4
    calculator, left_out = terms(width, blocks, heads, len(chars), 8)
    peaks = {reports[r]["lean"]["peak"] for r in (0, 1)}
    assert len(peaks) == 1
    peak = peaks.pop()
    check_rank_peak(peak, tokens, calculator, left_out, weights)
    without_loss = {name: b for name, b in calculator.items() if "loss" not in name}
    with pytest.raises(AssertionError):
        check_rank_peak(peak, tokens, without_loss, left_out, weights)
    one_block = 2 * heads * tokens * (width // heads) * 8            # a rank's keys and values, float64
    with pytest.raises(AssertionError):
        check_rank_peak(peak + one_block, tokens, calculator, left_out, weights)
