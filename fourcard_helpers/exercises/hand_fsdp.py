"""Build exercise of lesson 09: FSDP by hand, every weight of a Linear or Embedding held as 1/N per rank.

The learner's `HandFSDP(module, compute_dtype=None, shard_types=(nn.Linear, nn.Embedding))` keeps the
weight of every module of those classes as a flat shard per rank (padded: the number of ranks need
not divide it), all-gathers it before the module's forward and again before its backward, frees the
whole weight after each use, and reduce-scatters its gradient into the shard; every other parameter
stays whole (gradient all-reduced in `finish()`). `full_parameters()` gives every parameter whole, by
name. With `compute_dtype`, weights are gathered and used in it while the masters stay float32.

The ranks train a model with sizes no number of ranks divides for three SGD steps in float64 beside
one card, then a forward and a backward of a float32 copy under bf16. The check weighs what each rank holds between
uses (the point: a 1/N shard of each weight, no whole weight), reads the collectives of backward
(the Linear weights gathered again, at their padded sizes), compares full_parameters() with one card's, and reads the dtypes.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fourcard_helpers.check import CheckFailed
from fourcard_helpers.exercises import harness
from fourcard_helpers.language import N_, _

NAME = "hand-fsdp"
LESSON = "09"
TITLE = N_("FSDP by hand: each weight a padded 1/N shard, gathered for forward and again for backward, freed after")
DEFINES = ("HandFSDP",)
STEPS = 3
EXACT = 1e-12  # float64 rounding of sums taken in another order
SHARDED = {"embed.weight": 55, "hidden.weight": 35, "out.weight": 21}  # numbers each; 4 (and 2) divide none
WHOLE = 7 + 7 + 7 + 3  # hidden.bias, norm.weight, norm.bias, out.bias
LINEAR = ("hidden.weight", "out.weight")  # the weights whose backward needs them (an Embedding's needs its indices)


def off_by_one(traces: dict[int, list[dict[str, Any]]], nproc: int) -> str | None:
    """The sentence for shards cut as total // world (the remainder lost), read from the sizes each rank
    reported right after HandFSDP was built; None when no rank did so."""
    for rank, trace in traces.items():
        numbers = sorted(next((e["numbers"] for e in trace if e["kind"] == "shards"), []))
        for name, total in SHARDED.items():
            if total % nproc and total // nproc in numbers and math.ceil(total / nproc) not in numbers:
                got = total // nproc
                return _("rank {rank} holds shards of {numbers} numbers; {name} has {total}, which {n} ranks do not "
                         "divide: {n} shards of {got} (total // world) lose the last {lost}. Pad to {n} × ceil(total "
                         "/ world) = {padded} and cut the padding off after the gather.").format(
                    rank=rank, numbers=numbers, name=name, total=total, n=nproc, got=got, lost=total - nproc * got,
                    padded=nproc * math.ceil(total / nproc))
    return None


def check(path: Path, nproc: int = 4) -> str:
    """Run the learner's HandFSDP on `nproc` ranks; the verdict, or CheckFailed naming the mistake."""
    harness.skeleton(path, DEFINES)
    result = harness.launch(__file__, path, nproc, explain=lambda traces: off_by_one(traces, nproc))
    reports, trace = result.reports, result.traces[0]
    shares = {name: math.ceil(n / nproc) for name, n in SHARDED.items()}
    short = off_by_one(result.traces, nproc)
    if short:
        raise CheckFailed(short)
    for rank in range(nproc):
        whole = reports[rank]["whole_weights"]
        if whole:
            raise CheckFailed(_("between uses rank {rank} still holds the whole {names}: a rank keeps only its 1/{n} "
                                "shard of each weight; gather it for a use, and drop it after.").format(
                rank=rank, names=", ".join(whole), n=nproc))
    for rank in range(nproc):
        later, bound = reports[rank]["later_bytes"], reports[rank]["bound_bytes"]
        if later - bound >= reports[rank]["smallest_weight_bytes"]:
            raise CheckFailed(_("after the steps rank {rank} holds {later} bytes of tensors between uses, where its "
                                "shards and the whole parameters take {bound}: a gathered weight (or a copy of it) "
                                "was kept. Keep only the shards; gather for each use and drop the result after.").format(
                rank=rank, later=later, bound=bound))
    gathers = [call["numel"] for call in harness.launches(trace, "backward 1")
               if call["op"] in ("all_gather_into_tensor", "all_gather")]
    needed = [name for name in LINEAR if not {math.ceil(SHARDED[name] / nproc) * nproc,
                                              math.ceil(SHARDED[name] / nproc)} & set(gathers)]
    if needed:
        raise CheckFailed(_("{names} not gathered during backward (backward's gathers: {gathers} numbers): the whole "
                            "weights gathered for forward were kept alive until backward (autograd saved them, "
                            "as a Linear's backward needs its weight), so each rank held them all between the two "
                            "uses. Free them after forward and gather again for backward "
                            "(torch.autograd.graph.saved_tensors_hooks, or an autograd.Function).").format(
            names=", ".join(needed), gathers=gathers))
    gap = reports[0]["weight_gap"]
    if reports[0]["missing"]:
        raise CheckFailed(_("full_parameters() lacks {names}: it returns every parameter whole, by its name in the "
                            "wrapped model.").format(names=", ".join(reports[0]["missing"])))
    if gap > EXACT:
        raise CheckFailed(_("after {steps} SGD steps in float64 full_parameters() differs from one card's by up to "
                            "{gap:.3g} (largest in {name}; rounding alone stays under {exact:g}).").format(
            steps=STEPS, gap=gap, name=reports[0]["worst"], exact=EXACT))
    masters, seen = reports[0]["bf16_masters"], reports[0]["bf16_seen"]
    if masters != ["torch.float32"]:
        raise CheckFailed(_("with compute_dtype=torch.bfloat16 the masters (the shards the optimizer steps) are "
                            "{masters}: keep them float32, and cast to the compute dtype only what you gather and "
                            "use; bf16 masters lose small updates.").format(masters=", ".join(masters)))
    if seen != "torch.bfloat16":
        raise CheckFailed(_("with compute_dtype=torch.bfloat16 the layer's forward saw its weight in {seen}: gather "
                            "and use the weights in the compute dtype.").format(seen=seen))
    held = reports[0]["held_bytes"]
    return _("{n} ranks: between uses each rank holds {held} bytes of parameters (shards of {shares} numbers, "
             "padded, and the {whole} numbers of the whole parameters; one card: {full}); the Linear weights gathered again in backward (an Embedding's backward needs only its indices); after "
             "{steps} SGD steps in float64 full_parameters() equals one card's to {gap:.1e}; under bf16, float32 "
             "masters and bf16 weights in forward.").format(
        n=nproc, held=held, shares=sorted(shares.values()), whole=WHOLE, full=reports[0]["full_bytes"],
        steps=STEPS, gap=gap)


if __name__ == "__main__":
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    from fourcard_helpers.exercises import _ranks

    learner, device, _parameters = _ranks.start()
    rank, world = dist.get_rank(), dist.get_world_size()

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.hidden = nn.Embedding(11, 5), nn.Linear(5, 7)
            self.norm, self.out = nn.LayerNorm(7), nn.Linear(7, 3)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.out(self.norm(torch.tanh(self.hidden(self.embed(tokens)))))

    def model(dtype: torch.dtype) -> Net:
        torch.manual_seed(3)
        return Net().to(device, dtype)

    def held(wrapper: nn.Module, shapes: dict) -> tuple[int, list[str]]:
        """Bytes of every tensor the wrapper keeps (parameters, buffers, tensor attributes, alone or in a
        list, tuple or dict), and the names of the weights it keeps whole: a tensor whose storage holds
        from a weight's numbers up to its padded size. A storage freed in place (resize_(0), as FSDP
        frees) holds nothing."""
        tensors = [*wrapper.parameters(), *wrapper.buffers()]
        for m in wrapper.modules():
            for v in vars(m).values():
                inside = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else [v]
                tensors += [t for t in inside if isinstance(t, torch.Tensor)]
        tensors = [t for t in tensors if t.untyped_storage().nbytes() > 0]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        whole = sorted({name for t in tensors for name, numbers in shapes.items()
                        if numbers <= t.numel() <= -(-numbers // world) * world
                        and t.untyped_storage().nbytes() >= numbers * t.element_size()})
        return sum(storages.values()), whole

    net, reference = model(torch.float64), model(torch.float64)
    shapes = {name: p.numel() for name, p in net.named_parameters() if name.endswith("weight") and "norm" not in name}
    _ranks.phase("construction")
    fsdp = learner.HandFSDP(net)
    held_bytes, whole = held(fsdp, shapes)
    later_bytes = held_bytes
    bound_bytes = 8 * (sum(-(-numbers // world) for numbers in shapes.values())  # float64 shards and whole ones
                       + sum(p.numel() for name, p in reference.named_parameters() if name not in shapes))
    shard_numbers = [p.numel() for p in fsdp.parameters() if p.numel() not in (7, 3)]  # 7, 3: the whole ones
    _ranks.event("shards", numbers=shard_numbers)  # in the trace, in case a later step fails because of them
    optimizer = torch.optim.SGD(fsdp.parameters(), lr=0.3)
    one_card = torch.optim.SGD(reference.parameters(), lr=0.3)
    data = torch.Generator().manual_seed(0)
    for step in range(1, STEPS + 1):
        tokens, target = torch.randint(0, 11, (4 * world,), generator=data), torch.randn(4 * world, 3, generator=data)
        tokens, target = tokens.to(device), target.to(device, torch.float64)
        one_card.zero_grad()
        F.mse_loss(reference(tokens), target).backward()
        optimizer.zero_grad()
        mine = slice(4 * rank, 4 * (rank + 1))
        _ranks.phase(f"forward {step}")
        loss = F.mse_loss(fsdp(tokens[mine]), target[mine])
        _ranks.phase(f"backward {step}")
        loss.backward()
        _ranks.phase(f"finish {step}")
        fsdp.finish()
        optimizer.step()
        one_card.step()
        later, later_whole = held(fsdp, shapes)
        later_bytes = max(later_bytes, later)
        whole = sorted(set(whole) | set(later_whole))
    _ranks.phase("full_parameters")
    full = fsdp.full_parameters()
    ours = {name: full[name] for name, _p in reference.named_parameters() if name in full}
    gaps = {name: _ranks.gap([ours[name]], [p]) for name, p in reference.named_parameters() if name in ours}
    _ranks.phase("bf16")
    low = learner.HandFSDP(model(torch.float32), compute_dtype=torch.bfloat16)
    seen = []
    layer = low.module.hidden if hasattr(low, "module") else None
    if layer is not None:
        layer.register_forward_pre_hook(lambda m, args: seen.append(str(getattr(m, "weight").dtype)))
    low(tokens[mine]).float().pow(2).mean().backward()
    low.finish()
    _ranks.finish(held_bytes=held_bytes, whole_weights=whole, later_bytes=later_bytes, bound_bytes=bound_bytes,
                  smallest_weight_bytes=8 * min(shapes.values()),
                  full_bytes=8 * sum(p.numel() for p in reference.parameters()),
                  missing=sorted(set(dict(reference.named_parameters())) - set(full)),
                  weight_gap=max(gaps.values(), default=float("inf")), worst=max(gaps, key=gaps.get, default=""),
                  bf16_masters=sorted({str(p.dtype) for p in low.parameters()}), bf16_seen=seen[0] if seen else "")
