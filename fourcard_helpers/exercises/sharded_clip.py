"""Build exercise of lesson 10: gradient clipping when the gradients are sharded across the ranks.

ZeRO-2 and FSDP keep 1/N of the gradients per rank (of each gradient a piece, maybe empty or whole),
so no rank can measure the whole gradient's norm alone. The learner's
`clip_sharded_grad_norm_(shards, max_norm, group=None)` gets this rank's piece of each gradient
(flat, uneven, empty on some ranks), scales them in place as
`torch.nn.utils.clip_grad_norm_` scales whole gradients (by max_norm / (total + 1e-6), clamped to 1),
and returns the whole gradient's norm. The ranks hold the gradients of one card's model in float64,
cut into uneven shards, and the learner's function runs twice: with a max_norm below the norm (it
clips) and above it (it must leave the gradients alone). Every rank compares its shards with the same
positions of `clip_grad_norm_` on one card and the returned norm with one card's; the two sum the same
squares in another order, so they agree within the rounding bound of that sum, not to the bit. The
point of the mechanism is measured too: the elements the ranks' collectives carry (the course's
traces, and the collectives `_traffic.Traffic` sees), one number per rank where gathering the
gradients moves them all. A mistake is named from what the ranks saw: their scale factors, the
returned values and their dtype, the elements communicated; the shards are judged as the tensors passed in,
whatever the list holds after the call.

One launch can grade several files (`grade`): the tests grade every mistake in one launch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from fourcard_helpers.check import CheckFailed
from fourcard_helpers.exercises import harness
from fourcard_helpers.language import N_, _, sentences

NAME = "sharded-clip"
LESSON = "10"
TITLE = N_("Clipping sharded gradients: the whole gradient's norm from one all-reduced number per rank")
DEFINES = ("clip_sharded_grad_norm_",)
MAX_NORMS = (0.1, 10.0)  # the gradients' norm is 0.34: the first clips, the second must change nothing
UNIT = 2.0 ** -53  # float64's unit roundoff


def bound(elements: int, tensors: int) -> float:
    """The relative gap two correct float64 computations of the clipped gradient may show: each sums the same
    `elements` non-negative squares, in its own order (each addition rounds by at most UNIT of the whole sum),
    one card also takes and squares each of the `tensors` norms, and the square root, the division and the
    product round once each. A first-order bound of the rounding, for both of them together."""
    return 2 * (elements + 2 * tensors + 4) * UNIT


def cuts(length: int, world: int) -> list[int]:
    """Where a gradient of `length` numbers is cut between the ranks: rank r holds [cuts[r], cuts[r + 1]).
    Uneven on purpose (about 1, 3, 5, 7 sixteenths on four ranks), so that the first ranks' pieces of a
    short gradient are empty."""
    return [length * r * r // (world * world) for r in range(world + 1)]


def _judge(cases: list[list[dict[str, Any]]], launched: list[list[list[dict[str, Any]]]], world: int) -> str:
    """The verdict for one file, or CheckFailed naming the mistake. `cases[k][rank]` is what rank `rank` saw in
    case k, `launched[k][rank]` the collectives it launched during the learner's call."""
    for k, ranks in enumerate(cases):
        first, max_norm = ranks[0], ranks[0]["max_norm"]
        tol = bound(first["whole"], first["tensors"])
        if any(case["returned"] is None for case in ranks):
            raise CheckFailed(_("clip_sharded_grad_norm_ returned {kind}: return the whole gradient's norm, a tensor "
                                "of one number, as clip_grad_norm_ does.").format(kind=ranks[0]["kind"]))
        objects = sorted({name for case in ranks for name in case["collectives"]
                          if name.endswith("_object") or name in ("gather", "scatter")})
        moved = [max(sum(call["numel"] for call in calls), case["sent"] // 8)  # sends, batched ones too
                 for calls, case in zip(launched[k], ranks)]
        if objects or max(moved) > first["tensors"]:
            heaviest = max(range(world), key=lambda r: moved[r])
            calls = ", ".join(_("{op} of {numel}").format(op=c["op"], numel=c["numel"])
                              for c in launched[k][heaviest]) or ", ".join(objects)
            raise CheckFailed(_("to clip, rank {rank} put {elements} numbers into collectives ({calls}), where the "
                                "gradient has {whole} numbers in all and this rank holds {mine}: the gradients "
                                "were gathered to measure their norm. The norm needs one number from each rank, "
                                "the sum of the squares of its shards: all-reduce that one number (8 bytes in "
                                "float64) and take the square root, on every rank.").format(
                rank=heaviest, elements=moved[heaviest], calls=calls, whole=first["whole"],
                mine=ranks[heaviest]["elements"]))
        factors = {r: case["factor"] for r, case in enumerate(ranks) if case["factor"] is not None}
        if not max(factors.values()) - min(factors.values()) <= tol * max(factors.values()):  # NaN fails too
            shown = ", ".join(f"rank {r}: {f:.4f}" for r, f in factors.items())
            own = all(abs(case["factor"] - min(1.0, max_norm / (case["local"] + 1e-6))) <= tol * case["factor"]
                      for case in ranks if case["factor"] is not None)
            message = _("with max_norm={max_norm:g} the ranks scaled their shards by different factors ({shown}), so "
                        "the gradient put back together is no longer a scaled copy of the whole: its direction "
                        "changed.").format(max_norm=max_norm, shown=shown)
            if own:
                message = sentences(message, _("Each factor is max_norm over the norm of that rank's own shards: each rank "
                                   "clipped by its own piece. Sum the squares of the shards on each rank, "
                                   "all-reduce that sum, and scale every shard by the one factor the whole "
                                   "gradient's norm gives."))
            raise CheckFailed(message)
        returned = [case["returned"] for case in ranks]
        if not max(returned) - min(returned) <= tol * max(abs(x) for x in returned):
            local = all(abs(case["returned"] - case["local"]) <= tol * case["local"] for case in ranks)
            raise CheckFailed(_("the ranks returned different norms ({returned}){local}: every rank must return "
                                "the whole gradient's norm, {total:.6g}, the number that decided the factor.").format(
                returned=", ".join(f"{x:.6g}" for x in returned), total=first["total"],
                local=_(", each the norm of its own shards") if local else ""))
        if not abs(returned[0] - first["total"]) <= tol * first["total"]:
            locals_ = [case["local"] for case in ranks]
            message = _("the norm returned is {returned:.6g}, where clip_grad_norm_ on one card measures "
                        "{total:.6g}: they differ by {gap:.2g} of it, more than float64's rounding allows "
                        "({tol:.1g}).").format(returned=returned[0], total=first["total"],
                                               gap=abs(returned[0] - first["total"]) / first["total"], tol=tol)
            if first["dtype"] not in (None, "torch.float64"):
                message = sentences(message, _("The norm returned is a {dtype} tensor, where the gradients are float64: the "
                                   "squares were summed or all-reduced in a coarser type (`torch.tensor(x)` of a "
                                   "Python float is float32). Keep the sum in the gradients' dtype.").format(
                    dtype=first["dtype"]))
            elif abs(returned[0] * world ** 0.5 - first["total"]) <= tol * first["total"]:
                message = sentences(message, _("It is the true norm over √{world}: the squares were averaged over the ranks, not "
                                   "summed. The whole gradient's sum of squares is the sum of the ranks' sums: "
                                   "all-reduce with SUM (the default) and do not divide by the number of "
                                   "ranks.").format(world=world))
            elif abs(returned[0] - sum(locals_)) <= tol * returned[0]:
                message = sentences(message, _("It is the sum of the ranks' own norms ({locals}): norms do not add up, squares "
                                   "do. All-reduce each rank's sum of squares, then take the square root.").format(
                    locals=" + ".join(f"{x:.4g}" for x in locals_)))
            elif abs(returned[0] - first["total"] ** 2) <= tol * returned[0]:
                message = sentences(message, _("It is the sum of the squares: take its square root."))
            raise CheckFailed(message)
        factor = next(iter(factors.values()))
        if not abs(factor - first["factor_one_card"]) <= tol * first["factor_one_card"]:
            message = _("with max_norm={max_norm:g} and a norm of {total:.6g} your shards were scaled by {factor:.10g}, "
                        "where clip_grad_norm_ scales by {expected:.10g}.").format(
                max_norm=max_norm, total=first["total"], factor=factor, expected=first["factor_one_card"])
            if first["factor_one_card"] == 1.0 and factor > 1.0:
                message = sentences(message, _("The norm is below max_norm, so nothing must change, but the gradients were "
                                   "scaled up: clamp the factor to 1 (`.clamp(max=1.0)`). Clipping only ever "
                                   "shortens a gradient."))
            elif factor == 1.0 and any(case["replaced"] for case in ranks):
                message = sentences(message, _("The list's entries were replaced by new tensors; the gradient shards themselves "
                                   "were not scaled: scale them in place, e.g. `shard.mul_(factor)`."))
            elif factor == 1.0 and not any(case["changed"] for case in ranks):
                message = sentences(message, _("The shards passed in are unchanged: scale them in place (`shard.mul_(factor)`), "
                                   "as clip_grad_norm_ scales the gradients it is given."))
            elif abs(factor - max_norm / first["total"]) <= tol * factor:
                message = sentences(message, _("That is max_norm / norm: clip_grad_norm_ divides by norm + 1e-6."))
            raise CheckFailed(message)
        worst = max(case["gap"] for case in ranks)
        if not worst <= tol:
            raise CheckFailed(_("with max_norm={max_norm:g} the clipped shards differ from clip_grad_norm_'s by up to "
                                "{gap:.3g} of their size, more than float64's rounding allows ({tol:.1g}).").format(
                max_norm=max_norm, gap=worst, tol=tol))
    clips, keeps = (ranks[0] for ranks in cases)
    worst = max(case["gap"] for ranks in cases for case in ranks)
    equal = _("to the bit") if worst == 0 else _("within {gap:.0f} × 2⁻⁵³ of their size").format(gap=worst / UNIT)
    return _("{world} ranks, the gradients of a model ({whole} numbers in {tensors} tensors) in uneven shards, some "
             "empty: with max_norm={low:g} (the norm is {total:.4g}) and {high:g}, every rank's shards equal "
             "clip_grad_norm_'s on one card {equal} (float64; two sums of the same squares in different orders may "
             "differ by up to {bound:.0f} × 2⁻⁵³), and every rank returned the norm; each rank communicated "
             "{elements} number(s) per call, where the gradient has {whole}.").format(
        world=world, whole=clips["whole"], tensors=clips["tensors"], low=clips["max_norm"], high=keeps["max_norm"],
        total=clips["total"], equal=equal, bound=bound(clips["whole"], clips["tensors"]) / UNIT,
        elements=max(sum(call["numel"] for call in calls) for per_case in launched for calls in per_case))


def grade(paths: list[Path], nproc: int = 4) -> list[str | CheckFailed]:
    """Grade several files in one launch (a class's answers, or the tests' mistakes): for each, its verdict or the
    CheckFailed that names its mistake. A file that is still the skeleton raises NotImplementedError."""
    for path in paths:
        harness.skeleton(path, DEFINES)
    result = harness.launch(__file__, paths[0], nproc, files=[str(Path(p).resolve()) for p in paths])
    outcomes: list[str | CheckFailed] = []
    for f in range(len(paths)):
        cases = [[result.reports[rank]["files"][f][k] for rank in range(nproc)] for k in range(len(MAX_NORMS))]
        launched = [[harness.launches(result.traces[rank], f"file {f} case {k}") for rank in range(nproc)]
                    for k in range(len(MAX_NORMS))]
        try:
            outcomes.append(_judge(cases, launched, nproc))
        except CheckFailed as failure:
            outcomes.append(failure)
    return outcomes


def check(path: Path, nproc: int = 4) -> str:
    """Run the learner's clip_sharded_grad_norm_ on `nproc` ranks; the verdict, or CheckFailed naming the mistake."""
    outcome = grade([path], nproc)[0]
    if isinstance(outcome, CheckFailed):
        raise outcome
    return outcome


def _on_rank() -> None:
    """The ranks' side: one card's gradients, this rank's shards of them, the learner's clip, and what it did."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from fourcard_helpers.exercises import _ranks
    from fourcard_helpers.exercises._traffic import Traffic

    _learner, device, parameters = _ranks.start()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(7)
    net = _ranks.TiedNet().to(device, torch.float64)
    data = torch.Generator().manual_seed(0)
    x, y = (torch.randn(16, n, generator=data, dtype=torch.float64).to(device) for n in (6, 3))
    F.mse_loss(net(x), y).backward()  # every rank computes one card's gradients: the same on every rank
    grads = [p.grad.detach().flatten() for p in net.parameters() if p.grad is not None]
    whole = sum(g.numel() for g in grads)
    traffic, files = Traffic(), []
    for f, path in enumerate(parameters["files"]):
        learner = _ranks.load(path)
        found = []
        for k, max_norm in enumerate(MAX_NORMS):
            one_card = [torch.nn.Parameter(g.clone()) for g in grads]
            for p, g in zip(one_card, grads):
                p.grad = g.clone()
            measured = torch.nn.utils.clip_grad_norm_(one_card, max_norm)
            total = measured.item()
            expected = [p.grad.flatten() for p in one_card]
            pieces = [(c[rank], c[rank + 1]) for c in (cuts(g.numel(), world) for g in grads)]
            shards = [g[a:b].clone() for g, (a, b) in zip(grads, pieces)]
            before, given = torch.cat(shards), list(shards)  # the gradient shards themselves, judged after the call
            traffic.clear()
            _ranks.phase(f"file {f} case {k}")
            with traffic.watch():
                returned = learner.clip_sharded_grad_norm_(shards, max_norm)
            _ranks.phase(f"file {f} checked")
            after, right = torch.cat(given), torch.cat([e[a:b] for e, (a, b) in zip(expected, pieces)])
            try:
                value = float(returned)
            except (TypeError, ValueError, RuntimeError):
                value = None
            nonzero = right != 0
            found.append({
                "max_norm": max_norm, "total": total, "whole": whole, "tensors": len(grads),
                "factor_one_card": torch.clamp(max_norm / (measured + 1e-6), max=1.0).item(),  # clip_grad_norm_'s
                "returned": value, "kind": type(returned).__name__,
                "dtype": str(returned.dtype) if isinstance(returned, torch.Tensor) else None,
                "replaced": len(shards) != len(given) or any(s is not g for s, g in zip(shards, given)),
                "elements": before.numel(),
                "local": before.norm().item(),
                "factor": (after.norm() / before.norm()).item() if before.norm() > 0 else None,
                "changed": not torch.equal(after, before),
                "gap": (((after - right).abs()[nonzero] / right.abs()[nonzero]).nan_to_num(float("inf")).max().item()
                        if nonzero.any() else 0.0),
                "collectives": sorted(set(traffic.collectives)), "sent": traffic.bytes_sent()})
        files.append(found)
        dist.barrier()  # the next file starts together
    _ranks.finish(files=files)


if __name__ == "__main__":  # what each rank runs (harness.launch starts this file with torchrun)
    _on_rank()
