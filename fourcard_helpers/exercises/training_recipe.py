"""Build exercise of lesson 13b: nanoGPT's optimizer and learning-rate schedule, for a GPT sharded by FSDP2.

The learner's `configure_optimizer(model, steps, warmup, peak)` returns `(optimizer, scheduler)`: AdamW with
nanoGPT's two parameter groups (weight decay 0.1 on every parameter of two or more dimensions, none on the norms'
scales and shifts) and betas (0.9, 0.95), and a `LambdaLR` that warms the rate up to `peak` and then follows a
cosine down to a tenth of it. Each rank builds lesson 13's GPT (small, in float64), shards it as lesson 13 does
(`fully_shard` on every block, then on the whole model), hands it to the learner's function, and trains STEPS steps
on its quarter of each batch, clipping with `clip_grad_norm_` as nanoGPT does. The check reads what the ranks saw:
which parameters each group decays, AdamW's settings, the rate of every step; then the weights after the steps,
against one card trained with the reference recipe on the whole batches, in float64, judged against a float32
control (the same training on one card with each batch's gradient added up from its quarters in another order):
lesson 13's rule, the float64 gap at least 10,000× smaller. A mistake is named from that evidence.

One launch can grade several files (`grade`): the tests grade every mistake in one launch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from fourcard_helpers.check import CheckFailed
from fourcard_helpers.exercises import harness
from fourcard_helpers.language import N_, _

NAME = "training-recipe"
LESSON = "13b"
TITLE = N_("nanoGPT's optimizer and schedule for a GPT sharded by FSDP2: two parameter groups, warm-up then cosine")
DEFINES = ("configure_optimizer",)
STEPS, WARMUP, PEAK, MAX_NORM = 8, 2, 2e-3, 1.0   # short, so every part of the schedule shows; not the lesson's numbers
BATCH, VOCAB, CONTEXT, LAYERS, HEADS, WIDTH = 8, 24, 8, 2, 4, 16   # lesson 13's GPT, small: two windows per rank
SETTINGS = ("eps", "amsgrad", "maximize", "decoupled_weight_decay")   # AdamW's other settings that change the arithmetic
TINY = 1e-12   # relative: two computations of the same rate in float64 agree far closer than this


def _listed(names: list[str]) -> str:
    return ", ".join(names)


def _groups(seen: dict[str, Any]) -> None:
    """Raise CheckFailed if the parameter groups are not nanoGPT's: which parameters are decayed, and by how much."""
    everything, matrices = seen["names"], seen["matrices"]
    grouped = [name for group in seen["groups"] for name in group["names"]]
    missing = [name for name in everything if name not in grouped]
    if missing:
        raise CheckFailed(_("these parameters are in no group of the optimizer, so it never updates them: {names}. "
                            "Put every parameter of the model in one of the two groups.").format(names=_listed(missing)))
    decayed = sorted(name for group in seen["groups"] for name in group["names"] if group["weight_decay"] > 0)
    norms = sorted(set(everything) - set(matrices))
    extra, lacking = sorted(set(decayed) - set(matrices)), sorted(set(matrices) - set(decayed))
    default = seen["reference_weight_decay"]   # AdamW's default weight decay, which a group without the key may get
    for group in seen["groups"]:   # a group of norms only, decayed: its weight decay came from somewhere
        if group["weight_decay"] > 0 and group["names"] and not set(group["names"]) & set(matrices):
            raise CheckFailed(_("the group of {names} has weight_decay={decay:g}. A group whose dict gives no "
                                "weight_decay takes AdamW's own: its weight_decay argument, or the default, {default:g}. "
                                "nanoGPT does not decay these: give their group \"weight_decay\": 0.0.").format(
                names=_listed(group["names"]), decay=group["weight_decay"], default=default))
    if extra and not lacking and set(extra) == set(norms) and len(seen["groups"]) == 1:
        raise CheckFailed(_("every parameter is decayed, the norms' scales and shifts too ({norms}): that is one "
                            "group for everything, as torchtitan's default AdamW has. nanoGPT decays only the "
                            "parameters of two or more dimensions: pulled towards zero, a norm's scale would shrink "
                            "what the norm hands on. Make a second group, weight_decay=0.0, of the parameters with "
                            "p.dim() < 2.").format(norms=_listed(norms)))
    if extra:
        raise CheckFailed(_("decayed, though nanoGPT leaves them alone: {names}. Only parameters of two or more "
                            "dimensions (p.dim() >= 2) are decayed.").format(names=_listed(extra)))
    if lacking:
        hint = ""
        if all("embeddings" in name for name in lacking):
            hint = _(" That is minGPT's rule, the weights of nn.Linear layers only; nanoGPT's present rule decays "
                     "every parameter of two or more dimensions, the embedding tables too.")
        raise CheckFailed(_("not decayed, though nanoGPT decays them: {names}.{hint} Decay every parameter with "
                            "p.dim() >= 2 (a DTensor's dim() is the whole tensor's, so the test works on FSDP2's "
                            "shards).").format(names=_listed(lacking), hint=hint))
    rates = sorted({group["weight_decay"] for group in seen["groups"] if group["weight_decay"] > 0})
    if rates != [0.1]:
        raise CheckFailed(_("the matrices are decayed with weight_decay={rates}, where nanoGPT uses 0.1.").format(
            rates=", ".join(f"{rate:g}" for rate in rates)))


def _settings(seen: dict[str, Any]) -> None:
    """Raise CheckFailed if AdamW's betas, its peak rate or another setting that changes the arithmetic differs."""
    if not all(group["betas"] for group in seen["groups"]):
        raise CheckFailed(_("configure_optimizer built {optimizer}, an optimizer without Adam's betas: nanoGPT trains "
                            "with torch.optim.AdamW.").format(optimizer=seen["optimizer"]))
    for group in seen["groups"]:
        if tuple(group["betas"]) != (0.9, 0.95):
            raise CheckFailed(_("AdamW's betas are {betas}, where nanoGPT uses (0.9, 0.95): pass betas=(0.9, 0.95) "
                                "(AdamW's default is (0.9, 0.999)).").format(betas=tuple(group["betas"])))
        if not abs(group["initial_lr"] - PEAK) <= TINY * PEAK:
            raise CheckFailed(_("a group's learning rate before the schedule is {lr:g}, where the peak asked for is "
                                "{peak:g}: give AdamW lr=peak; LambdaLR multiplies it by the factor of each step.").format(
                lr=group["initial_lr"], peak=PEAK))
        if not group["settings"]["decoupled_weight_decay"]:
            raise CheckFailed(_("the weight decay is added to the gradient as an L2 term (Adam's weight_decay), so "
                                "Adam's division by the root of the squares scales it too; AdamW shrinks the "
                                "weights directly, by learning rate × weight_decay of themselves: use "
                                "torch.optim.AdamW."))
        changed = [f"{key}={group['settings'][key]!r}" for key in SETTINGS
                   if group["settings"][key] != seen["reference_settings"][key]]
        if changed:
            raise CheckFailed(_("AdamW was given {changed}, which nanoGPT leaves at the default.").format(
                changed=", ".join(changed)))


def _schedule(seen: dict[str, Any]) -> None:
    """Raise CheckFailed if the rate of some step is not nanoGPT's warm-up then cosine."""
    rates = seen["rates"]
    if any(len(set(step)) > 1 for step in rates):
        raise CheckFailed(_("the two groups ran at different rates in the same step ({rates}): one schedule applies "
                            "to both.").format(rates=rates[0]))
    factors = [step[0] / PEAK for step in rates]
    expected = [rate / PEAK for rate in seen["reference_rates"]]   # the reference recipe's scheduler, step by step
    if all(abs(f - e) <= TINY for f, e in zip(factors, expected)):
        return
    shown = lambda values: ", ".join(f"{v:.3f}" for v in values)   # noqa: E731
    said = _("the rates of the {steps} steps, as shares of the peak, were {got}; nanoGPT's are {expected}.").format(
        steps=STEPS, got=shown(factors), expected=shown(expected))
    if max(factors) - min(factors) <= TINY:
        hint = _("The rate never changed: the factor LambdaLR is given must depend on the step it is passed.")
    elif factors[0] <= TINY:
        hint = _("The first step ran at a rate of 0, so it changed nothing: step s of the warm-up gets "
                 "(s + 1) / (warmup + 1) of the peak.")
    elif any(abs(f - e) > TINY for f, e in zip(factors[:WARMUP], expected[:WARMUP])):
        hint = _("The warm-up is off: step s of the warm-up gets (s + 1) / (warmup + 1) of the peak, and the peak "
                 "comes at the first step after it.")
    elif abs(factors[WARMUP] - 1) > TINY:
        hint = _("The first step after the warm-up must run at the peak, where the cosine starts.")
    elif factors[-1] <= TINY:
        hint = _("The cosine ends at 0: nanoGPT's goes down to a tenth of the peak (its min_lr), "
                 "0.1 + 0.45 × (1 + cos(π × progress)).")
    else:
        hint = _("The cosine must reach a tenth of the peak at the last step: its progress runs from 0 at the step "
                 "after the warm-up to 1 at step steps - 1, (step - warmup) / (steps - 1 - warmup).")
    raise CheckFailed(f"{said} {hint}")


def _judge(seen: dict[str, Any]) -> str:
    """The verdict for one file (what rank 0 saw, every rank having agreed), or CheckFailed naming the mistake."""
    if seen.get("error"):
        raise CheckFailed(_("your configure_optimizer, or the training with what it returned, raised {error}").format(
            error=seen["error"]))
    if seen.get("returned"):
        raise CheckFailed(_("configure_optimizer returned {returned}: return a pair, (optimizer, scheduler), AdamW "
                            "and the LambdaLR that drives it.").format(returned=seen["returned"]))
    _groups(seen)
    _settings(seen)
    _schedule(seen)
    if not seen["gap"] <= 1e-4 * seen["control"]:
        raise CheckFailed(_("the groups, AdamW's settings and every step's rate are nanoGPT's, but after {steps} steps "
                            "the weights are {gap:.2g} from one card's in float64, where a float32 control differs "
                            "by {control:.2g}: the optimizer does something else as well.").format(
            steps=STEPS, gap=seen["gap"], control=seen["control"]))
    decayed = sum(1 for group in seen["groups"] if group["weight_decay"] > 0 for _name in group["names"])
    return _("{world} ranks, lesson 13's GPT (small, float64) sharded by FSDP2: weight decay 0.1 on its {decayed} "
             "parameters of two or more dimensions, none on its {kept} norm parameters; betas (0.9, 0.95); the rate "
             "of each of the {steps} steps nanoGPT's, warm-up to the peak at step {peak_step}, a tenth of it at the "
             "last; after the {steps} steps, clipped by clip_grad_norm_, the weights are one card's: {gap:.1e} "
             "apart in float64, at least 10,000× closer than a float32 control ({control:.1e}).").format(
        world=seen["world"], decayed=decayed, kept=len(seen["names"]) - decayed, steps=STEPS, peak_step=WARMUP + 1,
        gap=seen["gap"], control=seen["control"])


def grade(paths: list[Path], nproc: int = 4) -> list[str | CheckFailed]:
    """Grade several files in one launch (a class's answers, or the tests' mistakes): for each, its verdict or the
    CheckFailed that names its mistake. A file that is still the skeleton raises NotImplementedError."""
    for path in paths:
        harness.skeleton(path, DEFINES)
    result = harness.launch(__file__, paths[0], nproc, files=[str(Path(p).resolve()) for p in paths])
    outcomes: list[str | CheckFailed] = []
    for f in range(len(paths)):
        seen = result.reports[0]["files"][f]
        others = [result.reports[rank]["files"][f] for rank in range(1, nproc)]
        if any(other != seen for other in others) and not seen.get("error"):
            seen = {**seen, "error": _("different results on different ranks (rank 0 and another disagree on the "
                                       "groups, the rates or the weights): the optimizer must be built alike on "
                                       "every rank.")}
        try:
            outcomes.append(_judge(seen))
        except CheckFailed as failure:
            outcomes.append(failure)
    return outcomes


def check(path: Path, nproc: int = 4) -> str:
    """Run the learner's configure_optimizer on `nproc` ranks; the verdict, or CheckFailed naming the mistake."""
    outcome = grade([path], nproc)[0]
    if isinstance(outcome, CheckFailed):
        raise outcome
    return outcome


def _on_rank() -> None:
    """The ranks' side: lesson 13's GPT sharded by FSDP2, the learner's optimizer and schedule, STEPS steps, and what
    they did; one card's training with the reference recipe, and its float32 control."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from fourcard_helpers.exercises import _ranks
    from fourcard_helpers.gpt import GPT, GPTConfig
    from fourcard_helpers.solutions import configure_optimizer

    _learner, device, parameters = _ranks.start()
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))
    config = GPTConfig(vocab_size=VOCAB, block_size=CONTEXT, n_layer=LAYERS, n_head=HEADS, d_model=WIDTH)
    data = torch.Generator().manual_seed(0)   # the same batches on every rank and on one card
    batches = [torch.randint(VOCAB, (BATCH, CONTEXT + 1), generator=data) for _ in range(STEPS)]
    mine = slice(rank * BATCH // world, (rank + 1) * BATCH // world)

    reference_rates: list[float] = []

    def one_card(dtype: torch.dtype, quarters: tuple[int, ...] = ()) -> torch.Tensor:
        """The reference recipe on one card, each batch whole (or its gradient added up from its quarters in the
        order given: the control); the last weights, as one float64 vector. Notes the rate of each step."""
        torch.manual_seed(0)
        model = GPT(config).to(device, dtype)
        optimizer, scheduler = configure_optimizer(model, STEPS, WARMUP, PEAK)
        reference_rates[:] = []
        for batch in batches:
            reference_rates.append(optimizer.param_groups[0]["lr"])
            x, y = batch[:, :-1].to(device), batch[:, 1:].to(device)
            for q in quarters:
                (model(x.chunk(4)[q], y.chunk(4)[q])[1] / 4).backward()
            if not quarters:
                model(x, y)[1].backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()]).double()

    reference = one_card(torch.float64)
    control = (one_card(torch.float32, (3, 2, 1, 0)) - one_card(torch.float32)).abs().max().item()
    names = [name for name, _p in GPT(config).named_parameters()]
    matrices = [name for name, p in GPT(config).named_parameters() if p.dim() >= 2]
    defaults = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))]).defaults
    files = []
    for f, path in enumerate(parameters["files"]):
        learner = _ranks.load(path)
        torch.manual_seed(0)
        model = GPT(config).to(device, torch.float64)
        for block in model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        named = {id(p): name for name, p in model.named_parameters()}
        seen: dict[str, Any] = {"names": names, "matrices": matrices, "world": world, "control": control,
                                "reference_rates": reference_rates, "reference_weight_decay": defaults["weight_decay"],
                                "reference_settings": {key: defaults[key] for key in SETTINGS}}
        _ranks.phase(f"file {f}")
        try:
            returned = learner.configure_optimizer(model, STEPS, WARMUP, PEAK)
            if not (isinstance(returned, tuple) and len(returned) == 2
                    and isinstance(returned[0], torch.optim.Optimizer)
                    and isinstance(returned[1], torch.optim.lr_scheduler.LRScheduler)):
                seen["returned"] = (_("a tuple of {types}").format(types=", ".join(type(r).__name__ for r in returned))
                                    if isinstance(returned, tuple) else type(returned).__name__)
            else:
                optimizer, scheduler = returned
                seen["optimizer"] = type(optimizer).__name__
                seen["groups"] = [{"names": [named.get(id(p), "?") for p in group["params"]],
                                   "weight_decay": group.get("weight_decay", 0.0), "betas": list(group.get("betas", ())),
                                   "initial_lr": float(group.get("initial_lr", group["lr"])),
                                   "settings": {key: group.get(key) for key in SETTINGS}}
                                  for group in optimizer.param_groups]
                seen["rates"] = []
                for batch in batches:
                    x, y = batch[:, :-1][mine].to(device), batch[:, 1:][mine].to(device)
                    model(x, y)[1].backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
                    seen["rates"].append([float(group["lr"]) for group in optimizer.param_groups])   # this step's rate
                    optimizer.step()
                    optimizer.zero_grad()
                    scheduler.step()
                weights = torch.cat([p.full_tensor().detach().flatten() for p in model.parameters()]).double()
                seen["gap"] = (weights - reference).abs().max().item()
        except Exception as failure:   # noqa: BLE001 - the learner's code: its error is the evidence
            seen["error"] = f"{type(failure).__name__}: {str(failure).strip().splitlines()[0][:300]}"
        files.append(seen)
        dist.barrier()   # the next file starts together
    _ranks.finish(files=files)


if __name__ == "__main__":  # what each rank runs (harness.launch starts this file with torchrun)
    _on_rank()
