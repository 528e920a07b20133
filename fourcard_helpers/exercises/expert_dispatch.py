"""Build exercise of lesson 14: an expert-parallel layer's forward, from all-to-alls.

The learner's file defines `expert_dispatch(moe, x)`: the output of lesson 14's top-1 mixture of experts
`moe` for this rank's tokens `x`, this rank running only its own experts. It exchanges the counts with
an all-to-all, sends the tokens to their experts' cards with a second one (uneven splits), applies its
experts, and sends the results back with a third. The check runs it on real ranks in float64 and
compares each rank's output with one card's layer; it records every `all_to_all_single` (its splits,
written down before the call, so that a call that fails still tells) and weighs the bytes that leave
each card against the prediction from one card's routing. A mistake is named from that evidence:
tokens sent with no exchange of counts, splits that are the counts summed over the wrong dimension,
the right results in the wrong order (the output permuted), experts run on the wrong card, a rank
that skipped an all-to-all (from the traces, at the collectives' time limit).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from fourcard_helpers.exercises import LIMIT_SECONDS
from fourcard_helpers.language import N_, _, sentences

NAME = "expert-dispatch"
LESSON = "14"
TITLE = N_("Expert parallel by hand: the counts, the tokens and the way back, by all-to-alls")
DEFINES = ("expert_dispatch",)
WIDTH, EXPERTS, TOKENS = 16, 8, 64   # the layer's width and experts, and each rank's tokens
TOLERANCE = 1e-12                    # float64: a correct layer differs from one card by rounding only


def _splits(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event for event in trace if event["kind"] == "splits"]


def _explain(traces: dict[int, list[dict[str, Any]]]) -> str | None:
    """Why a launch failed, read in the ranks' traces: the all-to-alls' splits against the prediction."""
    calls = {rank: _splits(trace) for rank, trace in traces.items()}
    predicted = {rank: next((e for e in trace if e["kind"] == "predicted"), None) for rank, trace in traces.items()}
    counted = {rank: bool(c) and not c[0]["floating"] for rank, c in calls.items()}
    if calls and all(c for c in calls.values()) and not any(counted.values()):
        return _no_counts()
    if len(set(counted.values())) > 1:
        return None                   # some ranks exchanged counts, some did not: a skipped collective
    for rank in sorted(calls):
        tokens = [c for c in calls[rank] if c["floating"]]
        if tokens and predicted[rank] and tokens[0]["send"] != predicted[rank]["to_card"]:
            return _wrong_splits(rank, tokens[0]["send"], predicted[rank])
    return None


def _no_counts() -> str:
    return _("the tokens went out with no exchange of counts before them: a card cannot know how many rows each "
             "other card will send it (the splits are uneven, and change with every batch), so its receive splits "
             "were wrong. First send each card your number of rows for each of its experts "
             "(`dist.all_to_all_single(received, send)` on the counts), then size the tokens' all-to-all from them.")


def _wrong_splits(rank: int, sent: list[int] | None, predicted: dict[str, Any]) -> str:
    message = _("rank {rank}'s tokens' all-to-all had send splits {sent}, where its rows for each card are "
                "{rows} (the rows for that card's experts, added).").format(
                    rank=rank, sent=sent, rows=predicted["to_card"])
    if sent == predicted["other_dim"]:
        message = sentences(message, _("{sent} is the counts, viewed as (card, expert on it), summed over the wrong dimension "
                           "(over the cards, for each expert slot): sum over the experts of each card, "
                           "`counts.view(world, per_rank).sum(1)`.").format(sent=sent))
    return message


def _diagnose(reports: list[dict[str, Any]], world: int) -> str:
    """The verdict, or CheckFailed naming the mistake, from every rank's report."""
    from fourcard_helpers.check import CheckFailed

    per_rank = EXPERTS // world
    for rank, report in enumerate(reports):
        if report["shape"] != [TOKENS, WIDTH]:
            raise CheckFailed(_("rank {rank}'s expert_dispatch returned a result of shape {shape}: it must return "
                                "one row for each of this rank's tokens, the shape of `x` {wanted}.").format(
                                    rank=rank, shape=tuple(report["shape"]), wanted=(TOKENS, WIDTH)))
        own = list(range(rank * per_rank, (rank + 1) * per_rank))
        others = sorted(int(e) for e, rows in report["ran"].items() if rows and int(e) not in own)
        if others:
            raise CheckFailed(_("rank {rank} ran experts {others}, which live on other cards (its own are {own}): "
                                "each card runs only its own experts, on the rows the other cards send it.").format(
                                    rank=rank, others=others, own=own))
    wrong = [rank for rank, report in enumerate(reports) if report["wrong"]]
    if wrong:
        if not any(report["splits"] and not report["splits"][0]["floating"] for report in reports):
            raise CheckFailed(_no_counts())
        for rank, report in enumerate(reports):
            tokens = [c for c in report["splits"] if c["floating"]]
            if tokens and tokens[0]["send"] != report["predicted"]["to_card"]:
                raise CheckFailed(_wrong_splits(rank, tokens[0]["send"], report["predicted"]))
        counts = ", ".join(_("rank {rank}: {count} of {rows}").format(rank=r, count=reports[r]["wrong"], rows=TOKENS)
                           for r in wrong)
        found = _("the output differs from one card's layer (float64) in these rows: {counts}.").format(counts=counts)
        if all(reports[r]["permuted"] for r in wrong):
            sorted_order = all(reports[r]["by_expert"] for r in wrong)
            raise CheckFailed(sentences(found, _(
                "Every row holds the right result of another of the rank's tokens: the output is permuted{how}. The "
                "results come back in the order the tokens were sent; put each at its token's position (with the "
                "order the tokens were sorted by, `out[order] = ...`).").format(
                    how=_(", in the order the tokens were sorted by expert") if sorted_order else "")))
        raise CheckFailed(sentences(found, _("Largest difference {gap:.2g}.").format(
            gap=max(reports[r]["gap"] for r in wrong))))
    for rank, report in enumerate(reports):
        floating = [c for c in report["splits"] if c["floating"]]
        integer = [c for c in report["splits"] if not c["floating"]]
        sent = [sum(c["bytes"][o] for o in range(world) if o != rank) for c in floating]
        expected = report["predicted"]
        if len(floating) != 2 or len(integer) != 1:
            raise CheckFailed(_(
                "the output is right, but rank {rank} made {calls} all-to-all calls ({integer} of integer counts, "
                "{floating} of floating-point rows) where the exchange takes three: the counts, then the tokens, "
                "then the results. Every call is one more wait for the slowest card: send each kind once.").format(
                    rank=rank, calls=len(report["splits"]), integer=len(integer), floating=len(floating)))
        if sent != [expected["dispatch"], expected["combine"]]:
            raise CheckFailed(_(
                "the output is right, but rank {rank}'s tokens and results sent {sent} B to other cards where the "
                "rows that leave the card weigh {expected} B: send each row once, to its expert's card, and only the "
                "rows whose expert is on another card leave.").format(
                    rank=rank, sent=sent,
                    expected=[expected["dispatch"], expected["combine"]]))
    first = reports[0]
    counts_bytes = sum(first["splits"][0]["bytes"][o] for o in range(world) if o != 0)
    return _("equal to one card's layer on all {world} ranks (float64, within {tol:g}); each card ran only its own "
             "experts, and its all-to-alls sent to the other cards what one card's routing predicts: rank 0, "
             "{counts:,} B of counts, {dispatch:,} B of tokens, {combine:,} B of results (uneven: the rows whose "
             "expert is on another card); every rank: {all}.").format(
                 world=world, tol=TOLERANCE, counts=counts_bytes, dispatch=first["predicted"]["dispatch"],
                 combine=first["predicted"]["combine"],
                 all=", ".join(f"{r['predicted']['dispatch']:,} + {r['predicted']['combine']:,} B" for r in reports))


def check(path: Path, nproc: int = 4, seconds: float = LIMIT_SECONDS) -> str:
    """Run the file's `expert_dispatch` on `nproc` ranks; the verdict, or CheckFailed naming the mistake."""
    from fourcard_helpers.exercises import harness

    if EXPERTS % nproc:
        raise ValueError(_("{name} runs on a number of ranks that divides its {experts} experts (2, 4 or 8), so that "
                           "every card holds as many experts; not {nproc}.").format(
                               name=NAME, experts=EXPERTS, nproc=nproc))
    harness.skeleton(path, DEFINES)
    result = harness.launch(__file__, path, nproc, explain=_explain, seconds=seconds)
    return _diagnose([result.reports[rank] for rank in range(nproc)], nproc)


def _on_rank() -> None:
    """The ranks' side: run the learner's layer on this rank's tokens and report what it did."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _set_pg_timeout

    from fourcard_helpers.exercises import _ranks
    from fourcard_helpers.moe import MoE

    learner, device, parameters = _ranks.start()
    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = EXPERTS // world
    torch.manual_seed(0)
    moe = MoE(WIDTH, EXPERTS).to(device, torch.float64)     # one card's layer, the same on every rank
    x_all = torch.randn(world * TOKENS, WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x = x_all[rank * TOKENS:(rank + 1) * TOKENS].to(device)
    with torch.no_grad():
        expected = moe(x).cpu()                              # one card: this rank's tokens, every expert at hand
        expert = moe.route(x_all.to(device))[1][:, 0].cpu()  # every token's expert, every rank's tokens
    counts = torch.bincount(torch.arange(world * TOKENS) // TOKENS * EXPERTS + expert,
                            minlength=world * EXPERTS).view(world, world, per_rank)   # [card, expert's card, slot]
    row = WIDTH * 8
    predicted = {"to_card": counts[rank].sum(1).tolist(), "other_dim": counts[rank].sum(0).tolist(),
                 "dispatch": int(sum(counts[rank, o].sum() for o in range(world) if o != rank)) * row,
                 "combine": int(sum(counts[s, rank].sum() for s in range(world) if s != rank)) * row}
    _ranks.event("predicted", **predicted)

    calls: list[dict[str, Any]] = []
    real = dist.all_to_all_single

    def all_to_all_single(output: torch.Tensor, input: torch.Tensor, output_split_sizes: Any = None,  # noqa: A002
                          input_split_sizes: Any = None, *args: Any, **kwargs: Any) -> Any:
        """Record the splits first (a call that fails or waits still tells), then call the real one."""
        send = list(input_split_sizes) if input_split_sizes is not None else None
        split = send or [input.shape[0] // world] * world
        one = input.element_size() * (input[0].numel() if input.shape[0] else 0)
        call = {"floating": input.is_floating_point(), "send": send,
                "recv": list(output_split_sizes) if output_split_sizes is not None else None,
                "bytes": [n * one for n in split]}
        calls.append(call)
        _ranks.event("splits", **call)
        return real(output, input, output_split_sizes, input_split_sizes, *args, **kwargs)

    dist.all_to_all_single = all_to_all_single
    ran = {e: 0 for e in range(EXPERTS)}
    for e, layer in enumerate(moe.experts):
        layer.register_forward_hook(lambda module, inputs, output, e=e: ran.__setitem__(e, ran[e] + len(inputs[0])))
    dist.barrier()   # every rank is here, however slowly it started: from now on a collective waits `seconds` at most
    _set_pg_timeout(timedelta(seconds=parameters["seconds"]))
    _ranks.phase("expert dispatch")
    with torch.no_grad():
        returned = learner.expert_dispatch(moe, x.clone())
    out = returned.detach().cpu() if isinstance(returned, torch.Tensor) else torch.empty(0)
    report: dict[str, Any] = {"shape": list(out.shape), "ran": {str(e): n for e, n in ran.items()}, "splits": calls,
                              "predicted": predicted}
    if list(out.shape) == [TOKENS, WIDTH]:
        gaps = torch.cdist(out, expected, compute_mode="donot_use_mm_for_euclid_dist")   # [i, j]: row i against row j
        match = gaps.argmin(1)
        rows_wrong = (out - expected).abs().amax(1) > TOLERANCE
        permuted = bool(rows_wrong.any()) and bool((gaps.min(1).values <= TOLERANCE).all()) and len(
            set(match.tolist())) == TOKENS
        order = torch.argsort(expert[rank * TOKENS:(rank + 1) * TOKENS], stable=True)
        report.update(wrong=int(rows_wrong.sum()), gap=(out - expected).abs().max().item(), permuted=permuted,
                      by_expert=permuted and torch.equal(match, order))
    _ranks.finish(**report)


if __name__ == "__main__":  # what each rank runs (harness.launch starts this file with torchrun)
    _on_rank()
