"""Build exercise: DDP by hand, with the all-reduce overlapped with backward, and no_sync for accumulation.

The ranks train _ranks.TiedNet (a tied layer, a frozen one, a buffer) for three SGD steps in float64,
each rank starting from different weights, on its quarter of each batch; the third step accumulates
two micro-batches, the first under `no_sync()`. Each rank runs one card on the whole batch beside
it. The check judges, in this order: the broadcast (every rank starts from rank 0's weights and
buffers), the messages (one all-reduce per parameter with a gradient per step, none under no_sync),
the numbers (gradients and weights equal one card's to float64 rounding), and the overlap (the first
all-reduce launched before backward produced its last gradient, and not waited for at once).
"""
from __future__ import annotations

from pathlib import Path

from fourcard_helpers.check import CheckFailed
from fourcard_helpers.exercises import harness
from fourcard_helpers.language import _

NAME = "overlapped-ddp"
LESSON = "10"
TITLE = "DDP by hand: each gradient's all-reduce starts during backward; no_sync() for accumulation"
DEFINES = ("OverlappedDDP",)
STEPS = 3  # the last one accumulates two micro-batches
TRAINABLE = 6  # TiedNet's parameters with a gradient: embed, hidden (used twice), out; weight and bias each
EXACT = 1e-12  # float64 rounding of sums taken in another order, on values of order one


def check(path: Path, nproc: int = 4) -> str:
    """Run the learner's OverlappedDDP on `nproc` ranks; the verdict, or CheckFailed naming the mistake."""
    harness.skeleton(path, DEFINES)
    result = harness.launch(__file__, path, nproc)
    reports, trace = result.reports, result.traces[0]
    if not reports[0]["module_is_the_model"]:
        raise CheckFailed(_("`.module` of your wrapper is not the model it was given: keep it as self.module."))
    for what in ("parameters", "buffers"):
        late = [rank for rank in range(1, nproc) if reports[rank][f"start_{what}"] > 0]
        if late:
            raise CheckFailed(_("rank(s) {ranks} started from {what} different from rank 0's (by up to {gap:.3g}): "
                                "nothing was broadcast when the wrapper was built. Broadcast rank 0's parameters "
                                "and buffers in __init__ (dist.broadcast(tensor.data, src=0)).").format(
                ranks=late, what=what, gap=max(reports[r][f"start_{what}"] for r in late)))
    if harness.launches(trace, "no_sync micro-batch"):
        raise CheckFailed(_("{count} collective(s) launched during the micro-batch under no_sync(): no_sync must "
                            "only let gradients accumulate; the last micro-batch sends their sum.").format(
            count=len(harness.launches(trace, "no_sync micro-batch"))))
    for step in range(1, STEPS + 1):
        sent = harness.launches(trace, f"backward {step}") + harness.launches(trace, f"finish {step}")
        if len(sent) > TRAINABLE:
            raise CheckFailed(_("{count} all-reduces in step {step} for {trainable} parameters with a gradient: the "
                                "tied weight (one layer used twice) was reduced once per use. Use "
                                "register_post_accumulate_grad_hook, which fires once, after every use has added "
                                "its share; Tensor.register_hook fires per use, with that use's share only."
                                ).format(count=len(sent), step=step, trainable=TRAINABLE))
        if len(sent) < TRAINABLE:
            raise CheckFailed(_("{count} all-reduces in step {step}, for {trainable} parameters with a gradient: "
                                "some gradients were never averaged.").format(
                count=len(sent), step=step, trainable=TRAINABLE))
    grads = reports[0]["grad_gaps"]
    ratio = reports[0]["ratio"]
    if abs(ratio - nproc) < 1e-6:
        raise CheckFailed(_("the gradients are {n}× one card's: they were summed over the {n} ranks, not averaged. "
                            "Divide by dist.get_world_size() after the all-reduce.").format(n=nproc))
    for step, step_gap in enumerate(grads, 1):
        if step_gap > EXACT:
            tied = reports[0]["tied_gaps"][step - 1]
            others = reports[0]["other_gaps"][step - 1]
            if others <= EXACT < tied:
                raise CheckFailed(_("in step {step} every gradient equals one card's except the tied weight's "
                                    "(off by {gap:.3g}): it was reduced before both uses had added their share. "
                                    "Launch from register_post_accumulate_grad_hook, which fires once the "
                                    "gradient is complete.").format(step=step, gap=tied))
            accumulated = _(" (the step with two micro-batches, the first under no_sync())") if step == STEPS else ""
            raise CheckFailed(_("after step {step}{accumulated} the gradients differ from one card's by up to "
                                "{gap:.3g} (float64; rounding alone stays under {exact:g}).").format(
                step=step, accumulated=accumulated, gap=step_gap, exact=EXACT))
    if reports[0]["weight_gap"] > EXACT:
        raise CheckFailed(_("the gradients were right after finish(), but the weights after {steps} steps differ "
                            "from one card's by {gap:.3g}: did finish() leave a gradient to change later?").format(
            steps=STEPS, gap=reports[0]["weight_gap"]))
    backward = [e for e in trace if e["phase"] == f"backward {STEPS - 1}"]
    launched = [k for k, e in enumerate(backward) if e["kind"] == "launch"]
    ready = [k for k, e in enumerate(backward) if e["kind"] == "grad"]
    if not launched:
        raise CheckFailed(_("every all-reduce was launched after backward had ended (in finish()): nothing "
                            "overlaps. Launch each one from its parameter's hook, as soon as its gradient is ready."))
    waited_at_once = all(k + 1 < len(backward) and backward[k + 1]["kind"] == "wait" for k in launched)
    if waited_at_once:
        raise CheckFailed(_("each all-reduce was waited for right after it was launched (a blocking call, or "
                            "wait() in the hook): backward stops at every gradient and nothing overlaps. Launch "
                            "with async_op=True in the hook, keep the handles, wait in finish()."))
    still_to_come = sum(1 for k in ready if k > launched[0]) - 1  # the first launch is for the first gradient
    return _("{n} ranks, {steps} SGD steps in float64 (the last over two micro-batches, the first under "
             "no_sync()): every rank started from rank 0's weights; gradients equal one card's on the whole batch "
             "to {gap:.1e}, weights to {weights:.1e}; {trainable} all-reduces per step, one per parameter with a "
             "gradient (the tied weight once, the frozen one never), none under no_sync(); the first launched "
             "while backward still had {left} of {trainable} gradients to produce.").format(
        n=nproc, steps=STEPS, gap=max(grads), weights=reports[0]["weight_gap"], trainable=TRAINABLE,
        left=still_to_come)


def _ranks_main() -> None:
    import copy

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from fourcard_helpers.exercises import _ranks

    learner, device, _parameters = _ranks.start()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(100)
    reference = _ranks.TiedNet().to(device, torch.float64)  # rank 0's model, trained on one card
    torch.manual_seed(100 + rank)  # every other rank starts elsewhere: only a broadcast makes them equal
    net = _ranks.TiedNet().to(device, torch.float64)
    _ranks.phase("construction")
    ddp = learner.OverlappedDDP(net)
    net = ddp.module if isinstance(ddp.module, torch.nn.Module) else net
    findings = {"module_is_the_model": ddp.module is net,
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
    grad_gaps, tied_gaps, other_gaps, products = [], [], [], [0.0, 0.0]
    for step in range(1, STEPS + 1):
        x = torch.randn(world * rows, 6, generator=data, dtype=torch.float64).to(device)
        y = torch.randn(world * rows, 3, generator=data, dtype=torch.float64).to(device)
        mine = slice(rank * rows, (rank + 1) * rows)
        one_card.zero_grad()
        F.mse_loss(reference(x), y).backward()
        optimizer.zero_grad()
        if step < STEPS:
            _ranks.phase(f"backward {step}")
            F.mse_loss(ddp(x[mine]), y[mine]).backward()
        else:
            halves = (slice(rank * rows, rank * rows + rows // 2), slice(rank * rows + rows // 2, (rank + 1) * rows))
            _ranks.phase("no_sync micro-batch")
            with ddp.no_sync():
                (F.mse_loss(ddp(x[halves[0]]), y[halves[0]]) / 2).backward()
            _ranks.phase(f"backward {step}")
            (F.mse_loss(ddp(x[halves[1]]), y[halves[1]]) / 2).backward()
        _ranks.phase(f"finish {step}")
        ddp.finish()
        _ranks.phase(f"step {step}")
        params = dict(net.named_parameters())
        refs = dict(reference.named_parameters())
        ours = [params[n].grad if params[n].grad is not None else torch.zeros_like(params[n]) for n in names]
        theirs = [refs[n].grad for n in names]
        grad_gaps.append(_ranks.gap(ours, theirs))
        tied_gaps.append(_ranks.gap([params["hidden.weight"].grad], [refs["hidden.weight"].grad]))
        other_gaps.append(_ranks.gap([g for n, g in zip(names, ours) if not n.startswith("hidden")],
                                     [g for n, g in zip(names, theirs) if not n.startswith("hidden")]))
        if step == 1:  # later steps start from weights a wrong step has already moved
            products = [sum((a * b).sum().item() for a, b in zip(ours, theirs)), sum((b * b).sum().item() for b in theirs)]
        optimizer.step()
        one_card.step()
    _ranks.finish(**findings, grad_gaps=grad_gaps, tied_gaps=tied_gaps, other_gaps=other_gaps,
                  ratio=products[0] / products[1],
                  weight_gap=_ranks.gap(list(net.parameters()), list(reference.parameters())))


if __name__ == "__main__":
    _ranks_main()
