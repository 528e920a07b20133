"""Build exercise of lesson 05: DDP by hand with buckets, as DistributedDataParallel sends gradients.

The learner's `BucketedDDP(module, bucket_mb)` packs the gradients, in the order backward produces
them, into buckets (DDP records that order in its first step and rebuilds its buckets from it; the
exercise approximates it by the reverse of parameters()'s order): a gradient joins the current bucket, and
once a bucket holds bucket_mb MiB or more the next gradient starts a new one. Each bucket is one
all-reduce, launched when its last gradient is ready. The ranks train the model of overlapped_ddp
(_ddp.py) for two SGD steps in float64 with a cap that splits it in two; the check counts the
messages and their sizes against that rule, then judges the numbers and the overlap as there.
"""
from __future__ import annotations

from pathlib import Path

from fourcard_helpers.check import CheckFailed
from fourcard_helpers.exercises import _ddp, harness
from fourcard_helpers.language import N_, _

NAME = "bucketed-ddp"
LESSON = "05"
TITLE = N_("DDP by hand with buckets: one all-reduce per bucket of bucket_mb, launched when its last gradient is ready")
DEFINES = ("BucketedDDP",)
STEPS = 2
BUCKET_MB = 0.001  # 1049 bytes: 131 float64 numbers, so the small model makes two buckets
ELEMENT = 8  # bytes of a float64


def buckets(sizes: list[int], bucket_mb: float) -> list[int]:
    """The numbers in each bucket, in the order the buckets are sent, for gradients of `sizes` (numbers each),
    filled in the order the list gives."""
    found: list[int] = [0]
    for size in sizes:
        if found[-1] * ELEMENT >= bucket_mb * 2**20:
            found.append(0)
        found[-1] += size
    return found


def check(path: Path, nproc: int = 4) -> str:
    """Run the learner's BucketedDDP on `nproc` ranks; the verdict, or CheckFailed naming the mistake."""
    harness.skeleton(path, DEFINES)
    result = harness.launch(__file__, path, nproc, bucket_mb=BUCKET_MB)
    reports, trace = result.reports, result.traces[0]
    _ddp.judge_start(reports, nproc)
    sizes = reports[0]["sizes"]  # the parameters with a gradient, in the model's order
    wanted = buckets(sizes[::-1], BUCKET_MB)
    for step in range(1, STEPS + 1):
        got = [call["numel"] for call in _ddp.sent(trace, step)]
        if got == wanted:
            continue
        if sorted(got) == sorted(sizes):
            raise CheckFailed(_("step {step} sent one all-reduce per parameter ({got} numbers): no buckets. Pack the "
                                "gradients into buckets of bucket_mb MiB and send each bucket once.").format(
                step=step, got=got))
        if got == buckets(sizes, BUCKET_MB):
            raise CheckFailed(_("step {step} sent buckets of {got} numbers, filled in the parameters' order; backward "
                                "produces gradients in about the reverse order, and DDP fills its buckets in the "
                                "order the gradients arrive (recorded in its first step, its buckets rebuilt from "
                                "it): here take the reverse of parameters()'s order; expected {wanted}.").format(step=step, got=got, wanted=wanted))
        raise CheckFailed(_("step {step} sent messages of {got} numbers; with bucket_mb={mb} ({bytes} bytes, float64 "
                            "gradients taken in the reverse of parameters()'s order, a new bucket once one holds bucket_mb or "
                            "more) expected {wanted}.").format(step=step, got=got, mb=BUCKET_MB,
                                                               bytes=int(BUCKET_MB * 2**20), wanted=wanted))
    _ddp.judge_numbers(reports, nproc, STEPS, accumulate=False)
    left = _ddp.judge_overlap(trace, STEPS)
    return _("{n} ranks, {steps} SGD steps in float64: gradients equal one card's on the whole batch to {gap:.1e}, "
             "weights to {weights:.1e}; {count} all-reduces per step of {wanted} numbers, the buckets of "
             "bucket_mb={mb} filled in backward's order; the first launched while backward still had {left} of "
             "{trainable} gradients to produce.").format(
        n=nproc, steps=STEPS, gap=max(reports[0]["grad_gaps"]), weights=reports[0]["weight_gap"],
        count=len(wanted), wanted=wanted, mb=BUCKET_MB, left=left, trainable=_ddp.TRAINABLE)


if __name__ == "__main__":
    from fourcard_helpers.exercises import _ranks

    learner, _device, parameters = _ranks.start()
    _ddp.train(lambda net: learner.BucketedDDP(net, parameters["bucket_mb"]), STEPS, accumulate=False)
