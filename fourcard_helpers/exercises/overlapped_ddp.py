"""Build exercise of lesson 05: DDP by hand, each gradient's all-reduce overlapped with backward, and
no_sync() for gradient accumulation.

The ranks train a small model with a tied layer, a frozen one and a buffer for three SGD steps in
float64 (_ddp.py), each rank from different weights; the third step accumulates two micro-batches,
the first under `no_sync()`. The check judges, in this order: the broadcast (every rank starts from
rank 0's weights and buffers), the messages (one all-reduce per parameter with a gradient per step,
the tied one once, none under no_sync; a broadcast of the buffers before forward, as DDP's
broadcast_buffers=True, is no gradient and is allowed), the numbers (gradients and weights equal one card's on the
whole batch, to float64 rounding), and the overlap (the first all-reduce launched before backward
produced its last gradient, and not waited for at once: at least one gradient still to come).
"""
from __future__ import annotations

from pathlib import Path

from fourcard_helpers.check import CheckFailed
from fourcard_helpers.exercises import _ddp, harness
from fourcard_helpers.language import N_, _

NAME = "overlapped-ddp"
LESSON = "05"
TITLE = N_("DDP by hand: each gradient's all-reduce starts during backward; no_sync() for accumulation")
DEFINES = ("OverlappedDDP",)
STEPS = 3  # the last one accumulates two micro-batches


def check(path: Path, nproc: int = 4) -> str:
    """Run the learner's OverlappedDDP on `nproc` ranks; the verdict, or CheckFailed naming the mistake."""
    harness.skeleton(path, DEFINES)
    result = harness.launch(__file__, path, nproc)
    reports, trace = result.reports, result.traces[0]
    _ddp.judge_start(reports, nproc)
    during = [call for call in harness.launches(trace, "no_sync micro-batch") if call["op"] == "all_reduce"]
    if during:
        raise CheckFailed(_("{count} all-reduce(s) launched during the micro-batch under no_sync(): no_sync must "
                            "only let gradients accumulate; the last micro-batch sends their sum.").format(
            count=len(during)))
    for step in range(1, STEPS + 1):
        count = len(_ddp.sent(trace, step))
        if count > _ddp.TRAINABLE:
            raise CheckFailed(_("{count} all-reduces in step {step} for {trainable} parameters with a gradient: a "
                                "gradient was sent more than once. A hook registered twice on a parameter (a loop over "
                                "every module's parameters() meets a nested module's parameters again), or one that "
                                "fires once per call of a layer (a module's backward hook: the tied layer here runs "
                                "twice) sends too often. register_post_accumulate_grad_hook, registered once per "
                                "parameter, fires once per backward, after every use has added its share."
                                ).format(count=count, step=step, trainable=_ddp.TRAINABLE))
        if count < _ddp.TRAINABLE:
            raise CheckFailed(_("{count} all-reduces in step {step}, for {trainable} parameters with a gradient: "
                                "some gradients were never averaged.").format(
                count=count, step=step, trainable=_ddp.TRAINABLE))
    _ddp.judge_numbers(reports, nproc, STEPS, accumulate=True)
    left = _ddp.judge_overlap(trace, STEPS - 1)
    return _("{n} ranks, {steps} SGD steps in float64 (the last over two micro-batches, the first under "
             "no_sync()): every rank started from rank 0's weights; gradients equal one card's on the whole batch "
             "to {gap:.1e}, weights to {weights:.1e}; {trainable} all-reduces per step, one per parameter with a "
             "gradient (the tied layer's once, the frozen layer's never), none under no_sync(); the first launched "
             "while backward still had {left} of {trainable} gradients to produce.").format(
        n=nproc, steps=STEPS, gap=max(reports[0]["grad_gaps"]), weights=reports[0]["weight_gap"],
        trainable=_ddp.TRAINABLE, left=left)


if __name__ == "__main__":
    from fourcard_helpers.exercises import _ranks

    learner, _device, _parameters = _ranks.start()
    _ddp.train(learner.OverlappedDDP, STEPS, accumulate=True)
