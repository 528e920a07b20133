"""Build exercise of lesson 14: ring attention's forward, from send/recv and the online softmax.

The learner's file defines `ring_attention(q, k, v)`: this rank holds one block of the sequence's
queries, keys and values, each (heads, block, d); the function returns the attention (not causal)
of its queries to the WHOLE sequence's keys and values, passing the key/value blocks round a ring of
ranks and merging each block into a running output by the online-softmax rule. The check runs it on
real ranks in float64 and compares each rank's output with one card's attention over the whole
sequence. It measures the ring's point: each rank receives n−1 blocks of keys and values from one
neighbour, and never holds more than two received blocks at once (the one in use and the one
arriving; weighed each time a transfer completes), where gathering every block holds the whole
sequence. A mistake is named from what the ranks saw: outputs equal to the plain average of the
blocks' own outputs; wrong exactly at the queries whose largest score rose after the first block
(the running output not rescaled); a rank that skipped a send (named from the ranks' records at the
time limit); a gather, one transfer too many, blocks kept after use.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from fourcard_helpers.exercises import LIMIT_SECONDS
from fourcard_helpers.language import N_, _, sentences

NAME = "ring-attention"
LESSON = "14"
TITLE = N_("Ring attention's forward from send/recv and the online softmax")
DEFINES = ("ring_attention",)
HEADS, BLOCK, HEAD_DIM = 2, 16, 8   # each rank's block of the sequence: (heads, block, d)
TOLERANCE = 1e-12        # float64: a correct merge differs from one card by rounding only


def _diagnose_wait(stuck: dict[int, dict[str, Any]], seconds: float) -> str:
    """Why the ring waited for ever, from the ranks' records of the sends and receives they posted."""
    from fourcard_helpers.exercises._traffic import describe_wait

    sends = {rank: record["posted"]["send"] for rank, record in stuck.items()}
    most = max(sends.values())
    few = sorted(rank for rank, n in sends.items() if n < most)
    if few and len(few) < len(sends):
        cause = _("Rank(s) {ranks} posted {few} send(s) where the other ranks posted {most}: a rank that skips a "
                  "send leaves its neighbour waiting in a receive for ever. Every rank sends its block on at each "
                  "of the n − 1 steps, whatever its rank.").format(
                      ranks=few, few=min(sends[r] for r in few), most=most)
    elif all(record["pending"] and all(op["op"] == "recv" for op in record["pending"]) for record in stuck.values()):
        cause = _("Every rank that waited was waiting to receive, so no rank was sending: post the send first "
                  "without blocking (`req = dist.isend(...)`, then the receive, then `req.wait()`). That is enough on "
                  "gloo, which this check runs on; on NCCL an ungrouped send may wait for its receive, so post each "
                  "step's pair together with `dist.batch_isend_irecv([...])`.")
    else:
        cause = _("A send or receive that no rank matches waits for ever: every send needs a receive on its peer, "
                  "posted in an order that lets both proceed.")
    return describe_wait(stuck, seconds) + "\n" + cause


def _diagnose(reports: list[dict[str, Any]], world: int) -> str:
    """The verdict, or CheckFailed naming the mistake, from every rank's report."""
    from fourcard_helpers.check import CheckFailed

    used = sorted({name for report in reports for name in report["collectives"]})
    if used:
        raise CheckFailed(_("your ring attention calls {used}: gathering every rank's keys and values puts the whole "
                            "sequence on every card, which is what ring attention avoids. Pass the blocks round the "
                            "ring with `dist.isend`/`dist.irecv` (or `send`/`recv`), one block a step.").format(
                                used=", ".join(used)))
    shape = [HEADS, BLOCK, HEAD_DIM]
    for rank, report in enumerate(reports):
        if report["shape"] != shape:
            raise CheckFailed(_("rank {rank}'s ring_attention returned a result of shape {shape}: it must return the "
                                "output of this rank's queries, the shape of `q` {wanted}.").format(
                                    rank=rank, shape=tuple(report["shape"]), wanted=tuple(shape)))
    wrong = [rank for rank, report in enumerate(reports) if report["wrong"]]
    if wrong:
        rows = HEADS * BLOCK
        counts = ", ".join(_("rank {rank}: {count} of {rows}").format(rank=r, count=reports[r]["wrong"], rows=rows)
                           for r in wrong)
        found = _("the output differs from one card's attention over the whole sequence (float64) in these "
                  "(head, query) rows: {counts}; largest difference {gap:.2g}.").format(
                      counts=counts, gap=max(reports[r]["gap"] for r in wrong))
        if all(reports[r]["averaged"] for r in wrong):
            raise CheckFailed(sentences(found, _(
                "Every row is wrong, and each equals the plain average of the {world} blocks' own attention outputs: "
                "the blocks were averaged. Each block's output is normalised by its own sum of exp(score); merged, "
                "it must be weighted by its share of the joint sum, exp(lse_block − lse), which differs from block "
                "to block (a block with the query's largest scores weighs most).").format(world=world)))
        if all(reports[r]["not_rescaled"] for r in wrong):
            right = sum(rows - reports[r]["wrong"] for r in wrong)
            raise CheckFailed(sentences(found, _(
                "The wrong rows are exactly those whose largest score rose after the first block ({right} rows "
                "whose largest score was in their first block are right): the running output (and perhaps the "
                "running sum) was not rescaled when the running max changed. When the max rises from m to m', "
                "multiply both the sum and the output so far by exp(m − m') before adding the new block.").format(
                    right=right)))
        raise CheckFailed(found)
    block = reports[0]["block_bytes"]
    expected = (world - 1) * block
    for rank, report in enumerate(reports):
        peers = sorted(int(peer) for peer in report["sends_to"])
        held = report["held"] / block
        found = _("the output is right, but rank {rank} received {received:,} B (a ring: {world}−1 = {steps} blocks "
                  "of {block:,} B, {expected:,} B), sent to rank(s) {peers}, and held {held:g} received blocks at once "
                  "({held_bytes:,} B) when a transfer completed.").format(
                      rank=rank, received=report["received"], world=world, steps=world - 1, block=block,
                      expected=expected, peers=peers, held=held, held_bytes=report["held"])
        if len(peers) > 1:
            raise CheckFailed(sentences(found, _(
                "Sending to several ranks is a gather: every rank's keys and values end up on each card, the whole "
                "sequence. A ring sends to one neighbour and receives from the other, one block a step.")))
        if report["received"] == world * block:
            raise CheckFailed(sentences(found, _(
                "That is one transfer too many: after {steps} steps every block has come by, so the block received "
                "in the last step is never used. Post a transfer only while step < {world} − 1.").format(
                    steps=world - 1, world=world)))
        if report["received"] != expected:
            raise CheckFailed(sentences(found, _(
                "A ring passes each block on once a step, {steps} steps, one block of keys and values each.").format(
                    steps=world - 1)))
        if held > 2:
            raise CheckFailed(sentences(found, _(
                "A ring holds two blocks at most: the one in use and the one arriving. Something still refers to "
                "blocks already used and passed on: a list that keeps them, or the requests of earlier steps (an "
                "`isend`'s request, or the list from `dist.batch_isend_irecv`, keeps its tensor until it is "
                "dropped); keep only this step's requests, and drop each block once it has been used and passed on.")))
    most = max(report["held"] for report in reports) / block
    return _("equal to one card's attention over the whole sequence on all {world} ranks (float64, within {tol:g}); "
             "each rank received {steps} blocks of keys and values of {block:,} B ({expected:,} B) from one neighbour "
             "and held at most {most:g} received blocks at once when a transfer completed, never the whole "
             "sequence ({whole:,} B).").format(
                 world=world, tol=TOLERANCE, steps=world - 1, block=block, expected=expected, most=most,
                 whole=world * block)


def check(path: Path, nproc: int = 4, seconds: float = LIMIT_SECONDS) -> str:
    """Run the file's `ring_attention` on `nproc` ranks; the verdict, or CheckFailed naming the mistake."""
    from fourcard_helpers.check import CheckFailed
    from fourcard_helpers.exercises import _traffic, harness

    harness.skeleton(path, DEFINES)
    result, stuck = _traffic.launch(__file__, path, nproc, seconds)
    if stuck:
        raise CheckFailed(_diagnose_wait(stuck, seconds))
    return _diagnose([result.reports[rank] for rank in range(nproc)], nproc)


def _attention(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    """Attention of `q` to `k`, `v` (not causal), and each query's log-sum-exp of its scores."""
    import torch

    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


def _on_rank() -> None:
    """The ranks' side: run the learner's ring attention on this rank's block and report what it did."""
    import torch
    import torch.distributed as dist
    from torch.multiprocessing.reductions import StorageWeakRef

    from fourcard_helpers.exercises import _ranks
    from fourcard_helpers.exercises._traffic import Traffic, time_limit

    class Holding(Traffic):
        """Traffic that also weighs the received tensors' storages still alive each time a send or receive
        completes: the blocks a rank holds while it computes (a buffer received into counts whole, whatever part
        was used). Not when one is posted: while a step's new requests are being posted, the previous step's
        finished ones may still refer to the block before last, for the moment the learner's code replaces them."""

        def __init__(self) -> None:
            super().__init__()
            self.storages: dict[int, tuple[Any, int]] = {}
            self.held = 0

        def _post(self, kind: str, real: Any, tensor: torch.Tensor, peer: int | None, *args: Any, **kwargs: Any
                  ) -> Any:
            if kind == "recv":
                storage = tensor.untyped_storage()
                self.storages[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
            return super()._post(kind, real, tensor, peer, *args, **kwargs)

        def completed(self, op: dict[str, Any]) -> None:
            self.held = max(self.held, sum(n for ref, n in self.storages.values() if not ref.expired()))

    learner, device, parameters = _ranks.start()
    rank, world = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(14)          # the whole sequence, the same on every rank
    q, k, v = (torch.randn(HEADS, world * BLOCK, HEAD_DIM, dtype=torch.float64, generator=generator)
               for _ in range(3))
    mine = slice(rank * BLOCK, (rank + 1) * BLOCK)
    traffic = Holding()
    traffic.label = _ranks._phase = "ring attention"
    dist.barrier()
    with time_limit(parameters["seconds"], sys.argv[3], traffic):
        with traffic.watch():
            returned = learner.ring_attention(*(t[:, mine].clone().to(device) for t in (q, k, v)))
        dist.barrier()
    out = returned.detach().cpu() if isinstance(returned, torch.Tensor) else torch.empty(0)
    report: dict[str, Any] = {
        "shape": list(out.shape), "collectives": sorted(set(traffic.collectives)),
        "received": sum(op["bytes"] for op in traffic.ops if op["op"] == "recv"),
        "sends_to": {str(peer): n for peer, n in traffic.sends_to().items()}, "held": traffic.held,
        "block_bytes": 2 * HEADS * BLOCK * HEAD_DIM * 8}
    if list(out.shape) == [HEADS, BLOCK, HEAD_DIM]:
        expected, _lse = _attention(q[:, mine], k, v)          # one card: the whole sequence's keys
        rows_wrong = (out - expected).abs().amax(-1) > TOLERANCE
        blocks = [_attention(q[:, mine], k[:, b * BLOCK:(b + 1) * BLOCK], v[:, b * BLOCK:(b + 1) * BLOCK])
                  for b in range(world)]
        average = sum(o for o, _l in blocks) / world
        tops = [(q[:, mine] @ k[:, b * BLOCK:(b + 1) * BLOCK].transpose(-2, -1)).amax(-1) for b in range(world)]
        rose = []                                              # rows whose running max rose after their first block,
        for direction in (-1, 1):                              # blocks coming from the left or from the right
            order = [tops[(rank + direction * step) % world] for step in range(world)]
            rose.append(torch.stack([later > torch.stack(order[:i]).amax(0) for i, later in enumerate(order) if i]
                                    ).any(0))
        report.update(wrong=int(rows_wrong.sum()), gap=(out - expected).abs().max().item(),
                      averaged=bool(rows_wrong.all()) and (out - average).abs().max().item() <= TOLERANCE,
                      not_rescaled=any(bool(rows_wrong.any()) and torch.equal(rows_wrong, r) for r in rose))
    _ranks.finish(**report)


if __name__ == "__main__":  # what each rank runs (harness.launch starts this file with torchrun)
    _on_rank()
