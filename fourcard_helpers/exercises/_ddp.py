"""What the two DDP-by-hand exercises share (overlapped_ddp, bucketed_ddp): the training the ranks do
beside one card, and the judgement of the broadcast, the messages, the numbers and the overlap.

The ranks train _ranks.TiedNet (a layer used twice, a frozen one, a buffer) for a few SGD steps in
float64, each rank starting from different weights, on its quarter of each batch; with `accumulate`,
the last step takes two micro-batches, the first under `no_sync()`. Each rank runs one card on the
whole batch beside it and reports the differences; its trace holds every collective and the moment
each gradient was ready (a hook registered after the learner's, so it fires after theirs).
"""
from __future__ import annotations

from typing import Any, Callable

from fourcard_helpers.check import CheckFailed
from fourcard_helpers.exercises import harness
from fourcard_helpers.language import _

TRAINABLE = 6  # TiedNet's parameters with a gradient: embed, hidden (used twice), out; weight and bias each
EXACT = 1e-12  # float64 rounding of sums taken in another order, on values of order one


def train(build: Callable[[Any], Any], steps: int, accumulate: bool) -> None:
    """The ranks' side: wrap a TiedNet with `build`, train it beside one card, report, leave."""
    import copy

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from fourcard_helpers.exercises import _ranks

    device = _ranks.DEVICE
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(100)
    reference = _ranks.TiedNet().to(device, torch.float64)  # rank 0's model, trained on one card
    torch.manual_seed(100 + rank)  # every other rank starts elsewhere: only a broadcast makes them equal
    net = _ranks.TiedNet().to(device, torch.float64)
    _ranks.phase("construction")
    ddp = build(net)
    findings = {"module_is_the_model": getattr(ddp, "module", None) is net,
                "start_parameters": _ranks.gap(list(net.parameters()), list(reference.parameters())),
                "start_buffers": _ranks.gap(list(net.buffers()), list(reference.buffers()))}
    reference.load_state_dict(copy.deepcopy(net.state_dict()))  # judge the steps even after a bad start
    names = [name for name, p in net.named_parameters() if p.requires_grad]
    for name, param in net.named_parameters():
        if param.requires_grad:  # after the learner's hooks: marks the moment the gradient is ready
            param.register_post_accumulate_grad_hook(lambda p, name=name: _ranks.event("grad", name=name))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.2)
    one_card = torch.optim.SGD(reference.parameters(), lr=0.2)
    data = torch.Generator().manual_seed(0)
    rows = 4
    grad_gaps, tied_gaps, other_gaps, ratio = [], [], [], 1.0
    for step in range(1, steps + 1):
        x = torch.randn(world * rows, 6, generator=data, dtype=torch.float64).to(device)
        y = torch.randn(world * rows, 3, generator=data, dtype=torch.float64).to(device)
        one_card.zero_grad()
        F.mse_loss(reference(x), y).backward()
        optimizer.zero_grad()
        if accumulate and step == steps:
            first, last = slice(rank * rows, rank * rows + rows // 2), slice(rank * rows + rows // 2, (rank + 1) * rows)
            _ranks.phase("no_sync micro-batch")
            with ddp.no_sync():
                (F.mse_loss(ddp(x[first]), y[first]) / 2).backward()
            _ranks.phase(f"backward {step}")
            (F.mse_loss(ddp(x[last]), y[last]) / 2).backward()
        else:
            mine = slice(rank * rows, (rank + 1) * rows)
            _ranks.phase(f"backward {step}")
            F.mse_loss(ddp(x[mine]), y[mine]).backward()
        _ranks.phase(f"finish {step}")
        ddp.finish()
        _ranks.phase(f"step {step}")
        params, refs = dict(net.named_parameters()), dict(reference.named_parameters())
        ours = [params[n].grad if params[n].grad is not None else torch.zeros_like(params[n]) for n in names]
        theirs = [refs[n].grad for n in names]
        grad_gaps.append(_ranks.gap(ours, theirs))
        tied_gaps.append(_ranks.gap([g for n, g in zip(names, ours) if n.startswith("hidden")],
                                    [g for n, g in zip(names, theirs) if n.startswith("hidden")]))
        other_gaps.append(_ranks.gap([g for n, g in zip(names, ours) if not n.startswith("hidden")],
                                     [g for n, g in zip(names, theirs) if not n.startswith("hidden")]))
        if step == 1:  # later steps start from weights a wrong step has already moved
            ratio = sum((a * b).sum().item() for a, b in zip(ours, theirs)) / sum((b * b).sum().item() for b in theirs)
        optimizer.step()
        one_card.step()
    _ranks.finish(**findings, grad_gaps=grad_gaps, tied_gaps=tied_gaps, other_gaps=other_gaps, ratio=ratio,
                  weight_gap=_ranks.gap(list(net.parameters()), list(reference.parameters())),
                  sizes=[p.numel() for p in net.parameters() if p.requires_grad])


def judge_start(reports: dict[int, dict[str, Any]], nproc: int) -> None:
    """The wrapper keeps the model as `.module`, and every rank starts from rank 0's weights and buffers."""
    if not reports[0]["module_is_the_model"]:
        raise CheckFailed(_("`.module` of your wrapper is not the model it was given: keep it as self.module."))
    for what in ("parameters", "buffers"):
        late = [rank for rank in range(1, nproc) if reports[rank][f"start_{what}"] > 0]
        if late:
            raise CheckFailed(_("rank(s) {ranks} started from {what} different from rank 0's (by up to {gap:.3g}): "
                                "nothing was broadcast when the wrapper was built. Broadcast rank 0's parameters "
                                "and buffers in __init__ (dist.broadcast(tensor.data, src=0)).").format(
                ranks=late, what=what, gap=max(reports[r][f"start_{what}"] for r in late)))


def sent(trace: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    """The all-reduces a rank launched for step `step` (during its forward and backward, and its finish()).
    Other collectives are not gradients: a broadcast of the buffers before each forward, as DDP's
    broadcast_buffers=True does, is allowed."""
    return [call for call in harness.launches(trace, f"backward {step}") + harness.launches(trace, f"finish {step}")
            if call["op"] == "all_reduce"]


def judge_numbers(reports: dict[int, dict[str, Any]], nproc: int, steps: int, accumulate: bool) -> None:
    """Gradients after finish() and weights after the steps equal one card's, to float64 rounding."""
    report = reports[0]
    if abs(report["ratio"] - nproc) < 1e-6:
        raise CheckFailed(_("the gradients are {n}× one card's: they were summed over the {n} ranks, not averaged. "
                            "Divide by dist.get_world_size() after the all-reduce.").format(n=nproc))
    for step, step_gap in enumerate(report["grad_gaps"], 1):
        if step_gap > EXACT:
            tied, others = report["tied_gaps"][step - 1], report["other_gaps"][step - 1]
            if others <= EXACT < tied:
                raise CheckFailed(_("in step {step} every gradient equals one card's except the tied layer's "
                                    "(used twice in forward; off by {gap:.3g}): most likely it was reduced before "
                                    "both uses had added their share. Launch from register_post_accumulate_grad_hook, which "
                                    "fires once the gradient is complete.").format(step=step, gap=tied))
            last = accumulate and step == steps
            raise CheckFailed((_("after step {step} (two micro-batches, the first under no_sync()) the gradients "
                                 "differ from one card's by up to {gap:.3g} (float64; rounding alone stays under "
                                 "{exact:g}): the last micro-batch must send the sum of both.") if last else
                               _("after step {step} the gradients differ from one card's by up to {gap:.3g} "
                                 "(float64; rounding alone stays under {exact:g}).")).format(
                step=step, gap=step_gap, exact=EXACT))
    if report["weight_gap"] > EXACT:
        raise CheckFailed(_("the gradients were right after finish(), but the weights after {steps} steps differ "
                            "from one card's by {gap:.3g}: did finish() leave a gradient to change later?").format(
            steps=steps, gap=report["weight_gap"]))


def judge_overlap(trace: list[dict[str, Any]], step: int) -> int:
    """The first all-reduce of `step` launched during backward and not waited for at once; returns how many
    gradients backward still had to produce after the one whose hook launched it (at least one, or no
    message overlapped any of backward's work)."""
    backward = [e for e in trace if e["phase"] == f"backward {step}"]
    launched = [k for k, e in enumerate(backward) if e["kind"] == "launch" and e["op"] == "all_reduce"]
    ready = [k for k, e in enumerate(backward) if e["kind"] == "grad"]
    if not launched:
        raise CheckFailed(_("every all-reduce was launched after backward had ended (in finish()): nothing "
                            "overlaps. Launch each one from a hook, as soon as its gradients are ready."))
    if all(k + 1 < len(backward) and backward[k + 1]["kind"] == "wait" for k in launched):
        raise CheckFailed(_("each all-reduce was waited for right after it was launched (a blocking call, or "
                            "wait() in the hook): backward stops at every message and nothing overlaps. Launch "
                            "with async_op=True in the hook, keep the handles, wait in finish()."))
    left = sum(1 for k in ready if k > launched[0]) - 1
    if left < 1:
        raise CheckFailed(_("the first all-reduce of step {step} was launched only once backward had produced "
                            "every gradient (from the last gradient's hook, or a callback queued for the end of "
                            "backward): nothing overlaps. Launch each message from the hook of the gradient that "
                            "completes it, while backward still computes the others.").format(step=step))
    return left
