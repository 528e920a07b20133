"""Build exercise of lesson 07: the 1F1B schedule, driven by hand with send and receive.

The learner's file defines `one_f_one_b(stage, inputs, targets, micro_batches, shape, loss_fn)`:
one training step of this rank's stage (rank = stage) with the 1F1B schedule, for any number of
stages and micro-batches. The first rank gets the batch, the last the targets; activations go
forward with send/recv, gradients backward; it returns the batch's loss on the last rank and
leaves each parameter's gradient of that loss in `.grad`. The check runs it on real ranks with
more micro-batches than stages and with fewer, and compares the loss and every gradient with one
card in float64. It records each stage's order of forwards and backwards, which must be 1F1B's
(p − 1 − s warm-up forwards, then one forward and one backward, then the backwards left), and so
the micro-batches in flight: at most p − s on stage s, where GPipe's order holds all m. A mistake
is named from the evidence: GPipe's order and its peak, gradients m × one card's, or a wait that
never ends and the send missing on the other side of it.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fourcard_helpers.exercises import LIMIT_SECONDS
from fourcard_helpers.language import N_, _, sentences

NAME = "one-f-one-b"
LESSON = "07"
TITLE = N_("The 1F1B pipeline schedule with send/recv")
DEFINES = ("one_f_one_b",)
WIDTH, ROWS = 6, 2        # every stage is Linear(WIDTH, WIDTH) + tanh; ROWS rows per micro-batch


def cases(stages: int) -> list[int]:
    """The numbers of micro-batches tried: twice the stages, and fewer micro-batches than stages."""
    return [2 * stages, max(1, stages - 1)]


def roundings(stages: int, micro_batches: int) -> int:
    """float64's bound for a gap: this many roundings, each within eps/2 of the largest value, in two computations
    (the sums over the batch's rows, over each layer's inputs on every stage, and over the micro-batches)."""
    return ROWS * micro_batches + WIDTH * stages + micro_batches + 4


def check(path: Path, nproc: int = 4, seconds: float = LIMIT_SECONDS) -> str:
    """Run the file's `one_f_one_b` on `nproc` stages; the verdict, or CheckFailed naming the mistake."""
    from fourcard_helpers.check import CheckFailed
    from fourcard_helpers.exercises import _traffic, harness

    harness.skeleton(path, DEFINES)
    result, stuck = _traffic.launch(__file__, path, nproc, seconds)
    if stuck:
        raise CheckFailed(_diagnose_wait(stuck, seconds))
    return _diagnose(result.values("cases"), nproc)


def _diagnose_wait(stuck: dict[int, dict[str, Any]], seconds: float) -> str:
    """Which send is missing, from the ranks' records: a rank waits for message k + 1 from a peer that posted k."""
    from fourcard_helpers.exercises._traffic import describe_wait

    found = []
    for rank, record in sorted(stuck.items()):
        for op in record["pending"]:
            peer = op["peer"]
            if op["op"] != "recv" or peer not in stuck:
                continue
            got = record["received_from"].get(str(peer), 0)
            posted = stuck[peer]["sends_posted_to"].get(str(rank), 0)
            if posted <= got:
                said = _("stage {rank} waits for activation number {number} from stage {peer}, which posted only "
                         "{posted} sends to it: stage {peer} skips a send.") if peer == rank - 1 else \
                    _("stage {rank} waits for gradient number {number} from stage {peer}, which posted only "
                      "{posted} sends to it: stage {peer} skips a send.")
                found.append(said.format(rank=rank, number=got + 1, peer=peer, posted=posted))
    cause = " ".join(found) if found else _("A receive that no send matches waits for ever.")
    return sentences(describe_wait(stuck, seconds) + "\n" + cause, _(
        "Every micro-batch's activation goes forward from each stage but the last, and its gradient goes back "
        "from each stage but the first: m sends each way per link."))


def _diagnose(cases_by_rank: list[list[dict[str, Any]]], stages: int) -> str:
    from fourcard_helpers.check import CheckFailed
    from fourcard_helpers.schedules import peak_in_flight, pipeline_order

    for k, micro_batches in enumerate(cases(stages)):
        found = [cases[k] for cases in cases_by_rank]
        bound = roundings(stages, micro_batches) * 2.0 ** -52
        off = {(rank, name): g for rank, f in enumerate(found) for name, g in f["grads"].items()
               if g["gap"] > bound * g["scale"]}
        if off:
            if all(abs(g["ratio"] - micro_batches) < 1e-9 for g in off.values()) and len(off) == sum(
                    len(f["grads"]) for f in found):
                raise CheckFailed(_("with {m} micro-batches every gradient is exactly {m} × one card's: each "
                                    "micro-batch's loss must be divided by m = {m} before its backward, so that the "
                                    "gradients the micro-batches add up are those of the batch's mean loss."
                                    ).format(m=micro_batches))
            listed = "; ".join(_("stage {rank} {name}: {ratio:.3g} ×").format(rank=rank, name=name, ratio=g["ratio"])
                               for (rank, name), g in off.items())
            raise CheckFailed(_("with {p} stages and {m} micro-batches these gradients differ from one card's (about "
                                "so many times one card's): {listed}.").format(p=stages, m=micro_batches,
                                                                              listed=listed))
        loss = found[-1]["loss"]
        if loss is None or loss["gap"] > bound * loss["scale"]:
            raise CheckFailed(_("with {m} micro-batches the last stage returned the loss {got}, where one card's loss "
                                "of the whole batch is {want:.6g}: return the mean over the batch, the sum of the "
                                "micro-batches' losses each divided by m.").format(
                                    m=micro_batches, got="None" if loss is None else f"{loss['value']:.6g}",
                                    want=found[-1]["one_card_loss"]))
        for stage, f in enumerate(found):
            order = [tuple(e) for e in f["events"]]
            want = pipeline_order("1F1B", stages, micro_batches)[stage]
            if order == want:
                continue
            if order == pipeline_order("GPipe", stages, micro_batches)[stage]:
                raise CheckFailed(_("the numbers are right, but stage {stage} runs every forward before any backward "
                                    "(GPipe's order): with {m} micro-batches it holds {peak} micro-batches' "
                                    "activations at once, where 1F1B's order holds at most p − s = {most}. Run "
                                    "p − 1 − s = {warmup} forwards first, then one forward and one backward in turn, "
                                    "then the backwards left.").format(
                                        stage=stage, m=micro_batches, peak=peak_in_flight(order),
                                        most=peak_in_flight(want), warmup=min(stages - 1 - stage, micro_batches)))
            raise CheckFailed(_("the numbers are right, but stage {stage} ran {order} (peak {peak} in flight) where "
                                "1F1B runs {want} (peak {most}).").format(
                                    stage=stage, order=" ".join(f"{op}{i}" for op, i in order),
                                    peak=peak_in_flight(order), want=" ".join(f"{op}{i}" for op, i in want),
                                    most=peak_in_flight(want)))
    peaks = {m: [peak_in_flight([tuple(e) for e in cases[k]["events"]]) for cases in cases_by_rank]
             for k, m in enumerate(cases(stages))}
    more, fewer = cases(stages)
    return _("the loss and every parameter's gradient equal one card's in float64 within its rounding, for {p} stages "
             "with {more} and with {fewer} micro-batches; every stage ran 1F1B's order, which with {more} micro-batches "
             "allows the stages at most {peaks} micro-batches' activations at once (p − s) if each is freed after "
             "its backward, where GPipe's order keeps {more} on every stage.").format(p=stages, more=more, fewer=fewer, peaks=peaks[more])


def _on_rank() -> None:
    """The ranks' side: the learner's step on this stage, against one card's step of the whole model."""
    import copy

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from fourcard_helpers.exercises import _ranks
    from fourcard_helpers.exercises._traffic import Traffic, time_limit

    class Recorded(torch.nn.Module):
        """The stage as the learner gets it: records F(i) at each forward, B(i) when its output's gradient arrives."""

        def __init__(self, block: torch.nn.Module) -> None:
            super().__init__()
            self.block, self.events = block, []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            i = sum(op == "F" for op, _ in self.events)
            self.events.append(("F", i))
            y = self.block(x)
            if y.requires_grad:
                y.register_hook(lambda grad: self.events.append(("B", i)))
            return y

    learner, device, parameters = _ranks.start()
    rank, world = dist.get_rank(), dist.get_world_size()
    traffic, found = Traffic(), []
    for micro_batches in cases(world):
        torch.manual_seed(micro_batches)                 # every rank builds the same model, batch and targets
        blocks = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()).double().to(device)
                  for _ in range(world)]
        x = torch.randn(ROWS * micro_batches, WIDTH, dtype=torch.float64, device=device)
        t = torch.randn(ROWS * micro_batches, WIDTH, dtype=torch.float64, device=device)
        one_card = torch.nn.Sequential(*copy.deepcopy(blocks))
        one_card_loss = F.mse_loss(one_card(x), t)
        one_card_loss.backward()
        stage = Recorded(copy.deepcopy(blocks[rank]))
        traffic.clear()
        traffic.label = _ranks._phase = f"{world} stages, {micro_batches} micro-batches"
        dist.barrier()
        with time_limit(parameters["seconds"], sys.argv[3], traffic):
            with traffic.watch():
                loss = learner.one_f_one_b(stage, x if rank == 0 else None, t if rank == world - 1 else None,
                                           micro_batches, (ROWS, WIDTH), F.mse_loss)
            dist.barrier()
        grads = {}
        for (name, ours), theirs in zip(stage.block.named_parameters(), one_card[rank].parameters()):
            got = ours.grad if ours.grad is not None else torch.zeros_like(ours)
            grads[name] = {"gap": (got - theirs.grad).abs().max().item(), "scale": theirs.grad.abs().max().item(),
                           "ratio": ((got * theirs.grad).sum() / (theirs.grad * theirs.grad).sum()).item()}
        value = float(loss) if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None
        found.append({"micro_batches": micro_batches, "events": stage.events, "grads": grads,
                      "one_card_loss": one_card_loss.item(),
                      "loss": None if value is None else {"value": value, "gap": abs(value - one_card_loss.item()),
                                                          "scale": abs(one_card_loss.item())}})
    _ranks.finish(cases=found)


if __name__ == "__main__":  # what each rank runs (_traffic.launch starts this file with torchrun)
    _on_rank()
