"""Build exercise of lesson 09: ZeRO-1, an optimizer whose state is shared out among the ranks.

The learner's `ShardedOptimizer(params, optimizer_cls, **kwargs)` is a torch.optim.Optimizer: each
rank keeps `optimizer_cls`'s state for its own share of the parameters only, steps that share, and
after `step()` every rank holds every updated parameter. The ranks train a small model (same weights
and batches on every rank, so the gradients are one card's) for three Adam steps in float64 with two
parameter groups of different learning rates, beside one card's full Adam. The check weighs the
optimizer state each rank holds (the point: about 1/N of one card's, every parameter's state on
exactly one rank), then compares the weights with one card's, on every rank.
"""
from __future__ import annotations

from pathlib import Path

from fourcard_helpers.check import CheckFailed
from fourcard_helpers.exercises import harness
from fourcard_helpers.language import _

NAME = "sharded-optimizer"
LESSON = "09"
TITLE = "ZeRO-1: a torch.optim.Optimizer whose state each rank keeps for its share of the parameters only"
DEFINES = ("ShardedOptimizer",)
STEPS = 3
EXACT = 1e-12  # float64: the same element-wise arithmetic, so in practice 0


def check(path: Path, nproc: int = 4) -> str:
    """Run the learner's ShardedOptimizer on `nproc` ranks; the verdict, or CheckFailed naming the mistake."""
    harness.skeleton(path, DEFINES)
    reports = harness.launch(__file__, path, nproc).reports
    full = reports[0]["full_state_bytes"]
    held = [reports[rank]["state_bytes"] for rank in range(nproc)]
    if not reports[0]["is_optimizer"]:
        raise CheckFailed(_("ShardedOptimizer is not a torch.optim.Optimizer: subclass it, so that zero_grad(), "
                            "param_groups and learning-rate schedulers work as with any optimizer."))
    if min(held) >= full:
        raise CheckFailed(_("every rank holds the whole optimizer state ({bytes} bytes each, as one card): give "
                            "each rank's inner optimizer only the parameters that rank owns.").format(bytes=min(held)))
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
    if sum(held) != full:
        raise CheckFailed(_("the ranks hold {held} bytes of optimizer state, {total} together, where one card "
                            "holds {full}: each parameter's state must live on exactly one rank.").format(
            held=held, total=sum(held), full=full))
    return _("{n} ranks, {steps} Adam steps in float64 with two parameter groups: every rank's weights equal one "
             "card's to {gap:.1e}; optimizer state held per rank {held} bytes, {total} together = one card's "
             "{full}, so each rank keeps {share:.0%} of it at most.").format(
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
                  state_bytes=_ranks.optimizer_state_bytes(optimizer),
                  full_state_bytes=_ranks.optimizer_state_bytes(one_card),
                  weight_gap=_ranks.gap(list(net.parameters()), list(reference.parameters())))
