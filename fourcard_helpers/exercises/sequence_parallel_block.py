"""Build exercise of lesson 13: the tensor + sequence parallel plan of one GPT block, for `parallelize_module`.

The learner's `block_plan()` returns the plan of one `Block` of fourcard_helpers.gpt (keys relative to
the block: "attention_norm", "attention.wq", ...). The check applies it to every block of a small GPT
on a 1-D mesh of all the ranks, inside lesson 13's plan for the rest of the model (the embedding's
output made whole, then cut into parts of the sequence, one per rank, before the first block; the
final norm sequence parallel; the output layer by columns), and runs one forward and backward in
float64 beside one card. It compares the loss and every gradient (DTensors made whole), and counts, with PyTorch's
CommDebugMode, the collectives of forward and of backward against the plan: per block, one all-gather
of the sequence before each sub-layer and one reduce-scatter after it, and as many in backward.
A wrong plan is named from the evidence: a linear layer holding the wrong slice of its weight (a
row layer planned as a column one, a layer left whole), a sub-layer returning the whole sequence
where the residual stream holds parts, a sub-layer told its input is whole where each rank holds a
part, norms' gradients that are each rank's part, more gathers than the plan needs, a gathered input
handed on as a plain tensor (an all-reduce in backward per column layer).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from fourcard_helpers.language import N_, _

NAME = "sequence-parallel-block"
LESSON = "13"
TITLE = N_("The tensor + sequence parallel plan of a GPT block, for parallelize_module")
DEFINES = ("block_plan",)
VOCAB, CONTEXT, LAYERS, HEADS, WIDTH, BATCH = 24, 8, 2, 4, 16, 2   # 2 and 4 ranks divide the heads and the sequence
ULPS = 64  # float64: the same sums in another order differ by a few units in the last place of the largest value
COLUMNS = ("attention.wq", "attention.wk", "attention.wv", "mlp.w1")   # split by output features
ROWS = ("attention.wo", "mlp.w2")                                      # split by input features
CONNECTION_LOST = ("Connection closed by peer", "Connection reset by peer")   # gloo, after another rank failed
DENSE = {"attention.wq": (WIDTH, WIDTH), "attention.wk": (WIDTH, WIDTH), "attention.wv": (WIDTH, WIDTH),
         "attention.wo": (WIDTH, WIDTH), "mlp.w1": (4 * WIDTH, WIDTH), "mlp.w2": (WIDTH, 4 * WIDTH)}


def expected_counts(layers: int = LAYERS) -> dict[str, dict[str, int]]:
    """The collectives of one forward and one backward of the whole model under the sequence-parallel plan.

    Written by hand from the plan, not derived from a run (a count taken from a run would pass a wrong plan):
    per block an all-gather before attention and the MLP and a reduce-scatter after `wo` and `w2`, each
    mirrored in backward; the rest of the model (lesson 13's plan around the blocks) adds an all-reduce (the
    embedding), an all-gather before the output layer and one of its scores, and in backward the gather and the
    scatter of the cuts around the blocks."""
    return {"forward": {"all_reduce": 1, "all_gather_into_tensor": 2 * layers + 2, "reduce_scatter_tensor": 2 * layers},
            "backward": {"all_gather_into_tensor": 2 * layers + 1, "reduce_scatter_tensor": 2 * layers + 1}}


def check(path: Path, nproc: int = 4) -> str:
    """Apply the file's plan on `nproc` ranks; the verdict, or CheckFailed naming the mistake."""
    from fourcard_helpers.exercises import harness

    if HEADS % nproc or CONTEXT % nproc:
        raise ValueError(_("{name} runs on a number of ranks that divides the {heads} heads and the {context} "
                           "positions (2 or 4), so that every rank holds whole heads and an equal part of the "
                           "sequence; not {nproc}.").format(name=NAME, heads=HEADS, context=CONTEXT, nproc=nproc))
    harness.skeleton(path, DEFINES)
    result = harness.launch(__file__, path, nproc)
    return _diagnose([result.reports[rank] for rank in range(nproc)], nproc)


def _local_shapes(world: int) -> dict[str, dict[str, tuple[int, int]]]:
    """What each rank holds of a dense out × in weight when the layer is split by columns, by rows, or not."""
    return {name: {"ColwiseParallel": (out // world, inp), "RowwiseParallel": (out, inp // world),
                   "": (out, inp)} for name, (out, inp) in DENSE.items()}


def _diagnose(reports: list[dict[str, Any]], world: int) -> str:
    from fourcard_helpers.check import CheckFailed

    first = reports[0]
    if first.get("not_a_plan"):
        raise CheckFailed(_("block_plan() returned {got}; it should return a dict from the names inside a block "
                            "(\"attention_norm\", \"attention.wq\", ...) to parallel styles.").format(
                                got=first["not_a_plan"]))
    shapes = {name: tuple(shape) if shape else None for name, shape in first.get("shapes", {}).items()}
    for name in COLUMNS + ROWS:
        want = "ColwiseParallel" if name in COLUMNS else "RowwiseParallel"
        options = _local_shapes(world)[name]
        if shapes.get(name) is not None and shapes[name] != options[want]:
            style = next((style for style, shape in options.items() if shape == shapes[name]), None)
            held = {"ColwiseParallel": _("its output features split: ColwiseParallel"),
                    "RowwiseParallel": _("its input features split: RowwiseParallel"),
                    "": _("the whole weight: the plan has no entry for it")}.get(style, _("a slice no style makes"))
            reason = (_("its input is the heads' outputs, split by columns of wq, wk and wv, so it must split its "
                        "input features and sum the partial results")
                      if name in ROWS else
                      _("every rank reads the whole sequence, so it splits its output features (whole heads, or "
                        "whole columns of the MLP) and needs no sum"))
            raise CheckFailed(_("{name} holds {got} of its {dense} weight on every rank ({held}); it should "
                                "hold {want_shape}, as {want}: {reason}.").format(
                name=name, got=shapes[name], dense=DENSE[name], held=held,
                want_shape=options[want], want=want, reason=reason))
    failed = [(rank, report) for rank, report in enumerate(reports) if report.get("error")]
    if failed:   # the first rank with an error of its own: a closed connection follows another rank's failure
        rank, failing = next(((rank, report) for rank, report in failed if not any(
            words in report["error"] for words in CONNECTION_LOST)), failed[0])
        block_in, outputs, error = failing.get("block_input"), failing.get("outputs", {}), failing["error"]
        for part, shape in outputs.items():
            if block_in and shape and shape[1] == world * block_in[1]:
                raise CheckFailed(_("{part} returned {shape} on each rank where the residual stream holds {held}, "
                                    "{share} of the positions: its last layer must scatter its partial sums over "
                                    "the sequence, RowwiseParallel(output_layouts=Shard(1)), so that the sum "
                                    "x + {part}(…) adds the same positions ({error}).").format(
                    part=part, shape=tuple(shape), held=tuple(block_in), share=f"1/{world}", error=error))
            if block_in and shape and shape[1] < block_in[1]:
                raise CheckFailed(_("{part} returned {shape} on rank {rank} where the residual stream holds {held}: "
                                    "its input was declared whole (Replicate()) where each rank holds a part of "
                                    "the sequence, so nothing gathered it and its layers worked on that part alone. "
                                    "Declare what each rank holds, and gather it once: "
                                    "PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate()) "
                                    "({error}).").format(part=part, shape=tuple(shape), rank=rank,
                                                         held=tuple(block_in), error=error))
        raise CheckFailed(_("the plan fails on the ranks: {error}").format(error=error))
    bound = ULPS * 2.0 ** -52 * first["scale"]
    off = {name: gaps for name, gaps in first["gaps"].items() if gaps["gap"] > bound}
    norms = [name for name in off if "norm" in name]
    if norms and all(not off[name]["dtensor"] and off[name]["sum_gap"] <= bound for name in norms) and \
            len(norms) == len(off):
        raise CheckFailed(_("the loss and every other gradient equal one card's, but the gradients of {names} are "
                            "each rank's part: added over the {world} ranks they are one card's. Each rank "
                            "normalised only its {share} of the positions with a plain weight, so nothing added the "
                            "parts: plan the norms SequenceParallel(), which makes their weights DTensors whose "
                            "gradients are partial sums over the ranks (Partial()), added up when something "
                            "redistributes them: this check's full_tensor(), the optimizer's step, FSDP2.").format(
                                names=", ".join(norms), world=world, share=f"1/{world}"))
    if first["loss_gap"] > bound or off:
        raise CheckFailed(_("the plan runs, but the numbers are not one card's: the loss differs by {loss:.3g}; "
                            "gradients beyond float64's rounding ({bound:.1e}): {names}.").format(
            loss=first["loss_gap"], bound=bound,
            names=", ".join(f"{name} ({gaps['gap']:.2g})" for name, gaps in off.items()) or _("none")))
    plan = expected_counts()
    for rank, report in enumerate(reports):
        for phase in ("forward", "backward"):
            counted = report["counts"][phase]
            if counted != plan[phase]:
                extra = counted.get("all_gather_into_tensor", 0) - plan[phase]["all_gather_into_tensor"]
                hint = (_(" More all-gathers than the plan: a sub-layer without PrepareModuleInput hands its "
                          "part of the sequence to its column layers, and each gathers it for itself (wq, wk "
                          "and wv one each in forward). Gather once at each sub-layer's input: "
                          "PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate()) on "
                          "\"attention\" and on \"mlp\".")
                        if extra > 0 else
                        _(" All-reduces in backward where the plan has none: a sub-layer's PrepareModuleInput with "
                          "use_local_output=True hands its column layers the gathered sequence as a plain tensor, "
                          "so each of them (wq, wk and wv, w1) all-reduces the gradient of its input, where the "
                          "gradients of a DTensor are added first and reduce-scattered once. Keep the gathered "
                          "input a DTensor: use_local_output=False (the default).")
                        if phase == "backward" and counted.get("all_reduce", 0) > plan[phase].get("all_reduce", 0)
                        else "")
                raise CheckFailed(_("the numbers are one card's, but rank {rank}'s {phase} called {counted} where the "
                                    "plan calls {planned} (per block: one all-gather before each sub-layer, one "
                                    "reduce-scatter after it).{hint}").format(
                    rank=rank, phase=phase, counted=_counts(counted), planned=_counts(plan[phase]), hint=hint))
    total = expected_counts()
    return _("the loss and every gradient (DTensors made whole) equal one card's in float64 within {ulps} ulps of "
             "the largest, on {world} ranks; each rank held its 1/{world} of every linear layer of the blocks, and "
             "called {forward} in forward and {backward} in backward: per block one all-gather of the sequence "
             "before each sub-layer and one reduce-scatter after it, and nothing else.").format(
                 ulps=ULPS, world=world, forward=_counts(total["forward"]), backward=_counts(total["backward"]))


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {op}" for op, n in sorted(counts.items())) or _("no collective")


def _on_rank() -> None:
    """The ranks' side: the learner's plan in every block of a small GPT, against one card, in float64."""
    import warnings

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, \
        SequenceParallel, parallelize_module

    from fourcard_helpers.exercises import _ranks
    from fourcard_helpers.gpt import GPT, GPTConfig

    warnings.filterwarnings("ignore", "Full backward hook is firing")   # CommDebugMode's hooks: the input is integers
    learner, device, _parameters = _ranks.start()
    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))
    config = GPTConfig(vocab_size=VOCAB, block_size=CONTEXT, n_layer=LAYERS, n_head=HEADS, d_model=WIDTH)
    data = torch.Generator().manual_seed(1)   # the same batch on every rank: tensor parallelism splits the model
    x, y = (torch.randint(VOCAB, (BATCH, CONTEXT), generator=data).to(device) for _ in range(2))
    torch.manual_seed(0)
    one_card = GPT(config).to(device, torch.float64)
    _, loss_one = one_card(x, y)
    loss_one.backward()
    plan = learner.block_plan()
    if not isinstance(plan, dict):
        _ranks.finish(not_a_plan=repr(plan)[:200])
    torch.manual_seed(0)
    model = GPT(config).to(device, torch.float64)
    halves, whole = (Shard(1),), (Replicate(),)
    seen: dict[str, Any] = {"outputs": {}}
    local = lambda t: t.to_local() if isinstance(t, DTensor) else t   # noqa: E731
    counts: dict[str, dict[str, int]] = {}
    error, loss = "", None
    try:
        parallelize_module(model, mesh, {   # lesson 13's plan around the blocks, the learner's in each block
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
            "layers.0": PrepareModuleInput(input_layouts=whole, desired_input_layouts=halves, use_local_output=True),
            **{f"layers.{i}.{name}": style for i in range(LAYERS) for name, style in plan.items()},
            "norm": SequenceParallel(), "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())})
        model.output.weight = model.tok_embeddings.weight   # parallelize_module untied them
        block = model.layers[0]
        shapes = {name: list(local(block.get_submodule(name).weight).shape) for name in DENSE}
        block.register_forward_pre_hook(lambda m, args: seen.update(block_input=list(local(args[0]).shape)))
        for part in ("attention", "mlp"):
            block.get_submodule(part).register_forward_hook(
                lambda m, args, out, part=part: seen["outputs"].update({part: list(local(out).shape)}))
        _ranks.phase("forward")
        with CommDebugMode() as forward:
            _, loss = model(x, y)
        counts["forward"] = {op.__name__: n for op, n in forward.get_comm_counts().items()}
        _ranks.phase("backward")
        with CommDebugMode() as backward:
            loss.backward()
        counts["backward"] = {op.__name__: n for op, n in backward.get_comm_counts().items()}
    except Exception as failure:   # noqa: BLE001 - the learner's plan: its error is the evidence
        error = f"{type(failure).__name__}: {str(failure).strip().splitlines()[0][:300]}"
        shapes = locals().get("shapes", {})
        _ranks.finish(error=error, shapes=shapes, **seen)
    _ranks.phase("compare")
    reference = dict(one_card.named_parameters())
    gaps = {}
    for name, p in model.named_parameters():
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        total = grad.clone()
        dist.all_reduce(total)   # a plain tensor's gradient added over the ranks: a part each, or all of it each
        gaps[name] = {"gap": (grad - reference[name].grad).abs().max().item(),
                      "sum_gap": (total - reference[name].grad).abs().max().item(),
                      "dtensor": isinstance(p, DTensor)}
    scale = max(max(p.grad.abs().max().item() for p in one_card.parameters()), abs(loss_one.item()))
    _ranks.finish(shapes=shapes, counts=counts, gaps=gaps, scale=scale,
                  loss_gap=abs(loss.item() - loss_one.item()), **seen)


if __name__ == "__main__":  # what each rank runs (harness.launch starts this file with torchrun)
    _on_rank()
