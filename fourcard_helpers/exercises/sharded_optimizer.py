"""Build exercise of lesson 09: ZeRO-1, an optimizer whose state is shared out among the ranks.

The learner's `ShardedOptimizer(params, optimizer_cls, **kwargs)` is a torch.optim.Optimizer: each
rank keeps `optimizer_cls`'s state for its own share of the parameters only, steps that share, and
after `step()` every rank holds every updated parameter. The ranks train a small model (same weights
and batches on every rank, so the gradients are one card's) for three Adam steps in float64 with two
parameter groups of different learning rates, beside one card's full Adam. The check weighs the
optimizer state each rank holds, in numbers (Adam's exp_avg and exp_avg_sq; the point: about 1/N of
one card's, no more than 1/N plus the largest parameter's on any rank, and together one card's, up to
the padding of a flat group cut into N equal slices), then compares the weights with one card's, on
every rank.
"""
from __future__ import annotations

from pathlib import Path

from fourcard_helpers.check import CheckFailed
from fourcard_helpers.exercises import harness
from fourcard_helpers.language import N_, _

NAME = "sharded-optimizer"
LESSON = "09"
TITLE = N_("ZeRO-1: a torch.optim.Optimizer whose state each rank keeps for its share of the parameters only")
DEFINES = ("ShardedOptimizer",)
STEPS = 3
EXACT = 1e-12  # float64: the same element-wise arithmetic, so in practice 0


def check(path: Path, nproc: int = 4) -> str:
    """Run the learner's ShardedOptimizer on `nproc` ranks; the verdict, or CheckFailed naming the mistake."""
    harness.skeleton(path, DEFINES)
    reports = harness.launch(__file__, path, nproc).reports
    first = reports[0]
    full, largest = first["full_state_numbers"], first["largest_state_numbers"]
    padding = first["state_kinds"] * (nproc - 1) * first["groups"]  # a flat group cut into N equal slices
    held = [reports[rank]["state_numbers"] for rank in range(nproc)]
    if not first["is_optimizer"]:
        raise CheckFailed(_("ShardedOptimizer is not a torch.optim.Optimizer: subclass it, so that zero_grad(), "
                            "param_groups and learning-rate schedulers work as with any optimizer."))
    if min(held) >= full:
        raise CheckFailed(_("every rank holds the whole optimizer state ({numbers} numbers each, as one card): give "
                            "each rank's inner optimizer only the parameters that rank owns.").format(numbers=min(held)))
    share = min(full / nproc + largest + padding, full - 1)
    if max(held) > share:
        rank = held.index(max(held))
        raise CheckFailed(_("rank {rank} holds {numbers} numbers of optimizer state, the ranks {held}, where one card "
                            "holds {full}: a rank's share is about 1/{n} of it (at most {share:.0f}: 1/{n}, plus the "
                            "largest parameter's {largest}, which cannot be split between owners). Share the "
                            "parameters out by size, the largest first to the least loaded rank.").format(
            rank=rank, numbers=max(held), held=held, full=full, n=nproc, share=share, largest=largest))
    stale = {rank: reports[rank]["stale"] for rank in range(nproc) if reports[rank]["stale"]}
    if stale:
        rank, names = next(iter(stale.items()))
        raise CheckFailed(_("after step() rank {rank} still holds old values of {names}, which another rank "
                            "updated: every rank must receive every updated parameter from its owner "
                            "(dist.broadcast(param.data, src=owner)).").format(rank=rank, names=", ".join(names)))
    gaps = [reports[rank]["weight_gap"] for rank in range(nproc)]
    if max(gaps) > EXACT:
        raise CheckFailed(_("after {steps} Adam steps the weights differ from one card's by up to {gap:.3g} "
                            "(float64; the same arithmetic gives 0). Is each parameter group's learning rate "
                            "kept?").format(steps=STEPS, gap=max(gaps)))
    if sum(held) < full:
        raise CheckFailed(_("the weights are right, but the check finds {total} numbers of optimizer state on the "
                            "ranks together ({held}), where one card holds {full}: keep each rank's inner "
                            "optimizer as an attribute of ShardedOptimizer (alone, or in a list or dict), so that "
                            "its state can be weighed.").format(total=sum(held), held=held, full=full))
    if sum(held) > full + padding:
        raise CheckFailed(_("the ranks hold {held} numbers of optimizer state, {total} together, where one card "
                            "holds {full} (and padding to equal slices adds at most {padding}): some parameters' "
                            "state is kept on more than one rank.").format(
            held=held, total=sum(held), full=full, padding=padding))
    return _("{n} ranks, {steps} Adam steps in float64 with two parameter groups: every rank's weights equal one "
             "card's to {gap:.1e}; numbers of optimizer state held per rank {held}, {total} together (one card: "
             "{full}), so the largest share is {share:.0%} of one card's.").format(
        n=nproc, steps=STEPS, gap=max(gaps), held=held, total=sum(held), full=full, share=max(held) / full)


if __name__ == "__main__":
    import torch
    import torch.nn.functional as F

    from fourcard_helpers.exercises import _ranks

    learner, device, _parameters = _ranks.start()

    def model() -> torch.nn.Module:
        torch.manual_seed(7)
        return _ranks.TiedNet().to(device, torch.float64)

    def groups(net: torch.nn.Module) -> list[dict]:
        return [{"params": [net.embed.weight, net.out.bias], "lr": 0.01},
                {"params": [net.embed.bias, net.hidden.weight, net.hidden.bias, net.out.weight]}]

    net, reference = model(), model()
    _ranks.phase("construction")
    optimizer = learner.ShardedOptimizer(groups(net), torch.optim.Adam, lr=0.05)
    one_card = torch.optim.Adam(groups(reference), lr=0.05)
    data = torch.Generator().manual_seed(0)
    stale = []
    for step in range(1, STEPS + 1):
        x, y = torch.randn(16, 6, generator=data, dtype=torch.float64), torch.randn(16, 3, generator=data, dtype=torch.float64)
        for m, opt in ((net, optimizer), (reference, one_card)):
            opt.zero_grad()
            F.mse_loss(m(x.to(device)), y.to(device)).backward()
        before = {name: p.detach().clone() for name, p in net.named_parameters()}
        _ranks.phase(f"step {step}")
        optimizer.step()
        one_card.step()
        stale = [name for name, p in net.named_parameters() if p.requires_grad and torch.equal(p, before[name])]
    _ranks.finish(is_optimizer=isinstance(optimizer, torch.optim.Optimizer), stale=stale,
                  state_numbers=_ranks.optimizer_state_numbers(optimizer),
                  full_state_numbers=_ranks.optimizer_state_numbers(one_card),
                  largest_state_numbers=max(sum(t.numel() for t in state.values() if t.dim())
                                            for state in one_card.state.values()),
                  state_kinds=sum(1 for t in next(iter(one_card.state.values())).values() if t.dim()),
                  groups=len(one_card.param_groups),
                  weight_gap=_ranks.gap(list(net.parameters()), list(reference.parameters())))
