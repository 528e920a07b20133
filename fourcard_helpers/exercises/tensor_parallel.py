"""Build exercise of lesson 08: Megatron's f and g as autograd functions, and the column- and
row-parallel linear layers that make the Megatron MLP.

The learner's file defines `CopyToShards` (f: identity forward, all-reduce backward),
`ReduceFromShards` (g: all-reduce forward, identity backward), and two modules built from a dense
`nn.Linear` on every rank: `ColumnParallelLinear` (this rank's rows of the weight and the bias) and
`RowParallelLinear` (this rank's columns of the weight, the bias whole). The check makes the MLP
row(relu(column(x))) on real ranks and compares, in float64, its output and every gradient (those
of the weights gathered from the ranks' shards) with the dense MLP's. It counts the collectives:
the point of the Megatron split is one all-reduce forward and one backward, nothing gathered in
between. A wrong answer is named from its numbers: gradients exactly n × the dense ones, an input
gradient that is only a partial sum (the ranks' sum is right), a shard of the wrong shape, an output
off by exactly (n − 1) × the bias.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from fourcard_helpers.language import N_, _

NAME = "tensor-parallel-mlp"
LESSON = "08"
TITLE = N_("Column- and row-parallel layers with f and g as autograd functions")
DEFINES = ("CopyToShards", "ReduceFromShards", "ColumnParallelLinear", "RowParallelLinear")
BATCH, D, HIDDEN = 5, 12, 16  # the MLP d → hidden → d; 2 and 4 ranks divide hidden
ROUNDINGS = BATCH + D + HIDDEN + 4  # float64's bound: this many roundings, each eps/2 of the largest value, twice
QUANTITIES = ("output", "x.grad", "fc1.weight.grad", "fc1.bias.grad", "fc2.weight.grad", "fc2.bias.grad")


def check(path: Path, nproc: int = 4) -> str:
    """Run the file's layers as the Megatron MLP on `nproc` ranks; the verdict, or CheckFailed naming the mistake."""
    from fourcard_helpers.exercises import harness

    if HIDDEN % nproc:
        raise ValueError(_("{name} runs on a number of ranks that divides the hidden width {hidden} (2, 4, 8 or 16), "
                           "so that every rank holds an equal slice; not {nproc}.").format(
                               name=NAME, hidden=HIDDEN, nproc=nproc))
    harness.skeleton(path, DEFINES)
    result = harness.launch(__file__, path, nproc)
    calls = {rank: [(e["phase"], e["op"], e["numel"]) for e in harness.launches(trace)
                    if e["phase"] in ("forward", "backward")] for rank, trace in result.traces.items()}
    return _diagnose([result.reports[rank] for rank in range(nproc)], calls, nproc)


def _close(found: dict[str, float]) -> bool:
    return found["gap"] <= ROUNDINGS * 2.0 ** -52 * found["scale"]


def _diagnose(reports: list[dict[str, Any]], calls: dict[int, list[tuple[str, str, int]]], world: int) -> str:
    from fourcard_helpers.check import CheckFailed

    shapes = reports[0]["shapes"]
    expected = {"ColumnParallelLinear": {"weight": [HIDDEN // world, D], "bias": [HIDDEN // world]},
                "RowParallelLinear": {"weight": [D, HIDDEN // world], "bias": [D]}}
    cut = {"ColumnParallelLinear": _("the output features (dim 0 of the out × in weight: this rank's rows)"),
           "RowParallelLinear": _("the input features (dim 1 of the out × in weight: this rank's columns)")}
    for layer, want in expected.items():
        if shapes[layer] != want:
            raise CheckFailed(_("your {layer} keeps {got} from a dense layer of weight {dense}; it should keep weight "
                                "{weight} and bias {bias}, cutting {cut}{bias_note}.").format(
                layer=layer, got=", ".join(f"{k} {tuple(v) if v is not None else '—'}"
                                           for k, v in shapes[layer].items()),
                dense=(HIDDEN, D) if layer == "ColumnParallelLinear" else (D, HIDDEN),
                weight=tuple(want["weight"]), bias=tuple(want["bias"]), cut=cut[layer],
                bias_note=_(", and keeps the bias whole, to add once after the sum")
                if layer == "RowParallelLinear" else _(", with the matching slice of the bias")))
    if not all(report["shards_match"] for report in reports):
        bad = [rank for rank, report in enumerate(reports) if not report["shards_match"]]
        raise CheckFailed(_("on ranks {ranks} the shards have the right shapes but not the right numbers: rank r "
                            "keeps piece r of `weight.chunk(world, dim)` of the dense layer it is given.").format(
                                ranks=bad))
    found = [report["found"] for report in reports]
    off = {q: [rank for rank, f in enumerate(found) if not _close(f[q])] for q in QUANTITIES}
    if off["output"]:
        if all(f["output"]["minus_bias_gap"] <= ROUNDINGS * 2.0 ** -52 * f["output"]["scale"] for f in found):
            raise CheckFailed(_("the output is the dense MLP's plus exactly {extra} × fc2's bias, in every row: "
                                "RowParallelLinear adds its bias on every rank before the all-reduce sums the "
                                "ranks' results. Add it once, after the sum.").format(extra=world - 1))
        ratio = found[0]["output"]["ratio"]
        raise CheckFailed(_("the output differs from the dense MLP's (largest gap {gap:.3g} where values reach "
                            "{scale:.3g}; on ranks {ranks}; about {ratio:.3g} × the dense output).").format(
                                gap=found[0]["output"]["gap"], scale=found[0]["output"]["scale"],
                                ranks=off["output"], ratio=ratio))
    upstream = ("x.grad", "fc1.weight.grad", "fc1.bias.grad", "fc2.weight.grad")
    if all(off[q] for q in upstream) and not off["fc2.bias.grad"] and all(
            abs(f[q]["ratio"] - world) < 1e-9 for f in found for q in upstream):
        raise CheckFailed(_("the output is right, but the gradients of x, fc1 and fc2's weight are exactly {world} × "
                            "the dense ones (fc2's bias, added after g, is right): g all-reduces in backward too. "
                            "Its forward sums the partial outputs; its backward must hand the gradient on unchanged, "
                            "because every rank already holds the whole gradient of the sum.").format(world=world))
    if off["x.grad"] and not any(off[q] for q in QUANTITIES if q != "x.grad") and all(
            f["x.grad"]["sum_gap"] <= ROUNDINGS * 2.0 ** -52 * f["x.grad"]["scale"] for f in found):
        raise CheckFailed(_("the output and the weights' gradients are right, but each rank's gradient of x is a "
                            "partial sum: the {world} ranks' gradients add up to the dense one. f's backward must "
                            "all-reduce it, since every rank's slice of fc1 contributes a part.").format(world=world))
    wrong = {q: ranks for q, ranks in off.items() if ranks}
    if wrong:
        raise CheckFailed(_("the output is right, but these gradients differ from the dense MLP's: {wrong} "
                            "(quantity: ranks; about {ratios} × the dense values).").format(
                                wrong="; ".join(f"{q}: {ranks}" for q, ranks in wrong.items()),
                                ratios=", ".join(f"{found[ranks[0]][q]['ratio']:.3g}" for q, ranks in wrong.items())))
    expected_calls = [("forward", "all_reduce", BATCH * D), ("backward", "all_reduce", BATCH * D)]
    for rank, made in calls.items():
        if made != expected_calls:
            raise CheckFailed(_("the numbers are right, but rank {rank} called {made} where the Megatron MLP needs "
                                "one all_reduce of the {batch} × {d} output forward and one of its gradient backward, "
                                "nothing gathered in between.").format(
                                    rank=rank, made=", ".join(_("{op} ({phase}, {n} numbers)").format(op=op, phase=phase, n=n) for phase, op, n in made),
                                    batch=BATCH, d=D))
    return _("the output and the gradients of x, fc1 and fc2 (the weights' gathered from the {world} ranks' shards) "
             "equal the dense MLP's in float64 within its rounding ({roundings} roundings of eps/2 of the largest "
             "value), on every rank; each rank called one all_reduce of {batch} × {d} numbers forward and one "
             "backward, and nothing else.").format(world=world, roundings=ROUNDINGS, batch=BATCH, d=D)


def _compare(ours: Any, reference: Any) -> dict[str, float]:
    """Largest gap, largest reference value, and ours ÷ reference in the least-squares sense (n× shows as n)."""
    ours, reference = ours.detach().cpu().double(), reference.detach().cpu().double()
    return {"gap": (ours - reference).abs().max().item(), "scale": reference.abs().max().item(),
            "ratio": ((ours * reference).sum() / (reference * reference).sum()).item()}


def _on_rank() -> None:
    """The ranks' side: the learner's layers as the Megatron MLP, against the dense MLP, in float64."""
    import copy

    import torch
    import torch.distributed as dist

    from fourcard_helpers.exercises import _ranks

    learner, device, _parameters = _ranks.start()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)                                   # every rank builds the same dense MLP and input
    fc1 = torch.nn.Linear(D, HIDDEN).double().to(device)
    fc2 = torch.nn.Linear(HIDDEN, D).double().to(device)
    x = torch.randn(BATCH, D, dtype=torch.float64, device=device)
    probe = torch.linspace(-1, 1, BATCH * D, dtype=torch.float64, device=device).view(BATCH, D)
    column = learner.ColumnParallelLinear(copy.deepcopy(fc1))
    row = learner.RowParallelLinear(copy.deepcopy(fc2))
    shard = {"ColumnParallelLinear": (column, fc1, 0), "RowParallelLinear": (row, fc2, 1)}
    shapes = {name: {key: list(getattr(layer, key).shape) if isinstance(getattr(layer, key, None), torch.Tensor)
                     else None for key in ("weight", "bias")} for name, (layer, _, _) in shard.items()}
    if shapes != {"ColumnParallelLinear": {"weight": [HIDDEN // world, D], "bias": [HIDDEN // world]},
                  "RowParallelLinear": {"weight": [D, HIDDEN // world], "bias": [D]}}:
        _ranks.finish(shapes=shapes)                       # the kernel side names the cut
    shards_match = all(torch.equal(layer.weight.detach(), dense.weight.detach().chunk(world, dim)[rank])
                       for layer, dense, dim in shard.values())

    xd = x.clone().requires_grad_()
    dense_out = fc2(torch.relu(fc1(xd)))
    (dense_out * probe).sum().backward()
    xr = x.clone().requires_grad_()
    _ranks.phase("forward")
    out = row(torch.relu(column(xr)))
    _ranks.phase("backward")
    (out * probe).sum().backward()
    _ranks.phase("compare")                                # the check's own collectives from here on

    def gathered(grad: torch.Tensor, dim: int) -> torch.Tensor:
        pieces = [torch.empty_like(grad) for _ in range(world)]
        dist.all_gather(pieces, grad.contiguous())
        return torch.cat(pieces, dim)

    x_sum = xr.grad.clone()
    dist.all_reduce(x_sum)
    found = {"output": _compare(out, dense_out), "x.grad": _compare(xr.grad, xd.grad),
             "fc1.weight.grad": _compare(gathered(column.weight.grad, 0), fc1.weight.grad),
             "fc1.bias.grad": _compare(gathered(column.bias.grad, 0), fc1.bias.grad),
             "fc2.weight.grad": _compare(gathered(row.weight.grad, 1), fc2.weight.grad),
             "fc2.bias.grad": _compare(row.bias.grad, fc2.bias.grad)}
    found["output"]["minus_bias_gap"] = (out - dense_out - (world - 1) * fc2.bias).abs().max().item()
    found["x.grad"]["sum_gap"] = (x_sum - xd.grad).abs().max().item()
    _ranks.finish(shapes=shapes, shards_match=shards_match, found=found)


if __name__ == "__main__":  # what each rank runs (harness.launch starts this file with torchrun)
    _on_rank()
