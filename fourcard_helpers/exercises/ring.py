"""Build exercise of lesson 06: a ring all-reduce from send and receive alone, for any length.

The learner's file defines `ring_all_reduce(tensor)`: sum the 1-D `tensor` over all ranks, in
place, with a reduce-scatter and then an all-gather around the ring, using only point-to-point
calls (`dist.send`, `dist.recv`, `dist.isend`, `dist.irecv`, `dist.batch_isend_irecv`). The check runs it on real ranks for lengths that the
number of ranks does and does not divide (1 included, where most ranks own an empty chunk), in
float64 on integers, where every order of addition gives the same sum, so "equal to
`all_reduce`" means equal to the bit. It counts the bytes each rank sends: the ring's point is
2(n−1)/n × the tensor per rank, to its neighbours only, where gathering everything on one rank
makes that rank send (n−1) × the tensor; and it checks that the argument itself was summed, not a
copy. A mistake is named from what the ranks saw: a wait that never ends, the positions that are
wrong and on which ranks, the chunks each rank has right, a copy, the bytes, the peers.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fourcard_helpers.exercises import LIMIT_SECONDS
from fourcard_helpers.language import N_, _, sentences

NAME = "ring-all-reduce"
LESSON = "06"
TITLE = N_("A ring all-reduce from send/recv")
DEFINES = ("ring_all_reduce",)
LONG = 1_000_003      # the long case: a prime, so no number of ranks above 1 divides it


def lengths(world: int) -> list[int]:
    """The tensor lengths tried: 1, world ± 1, world, and a long one; world divides only some."""
    return sorted({n for n in (1, world - 1, world, world + 1, 3 * world + 1, LONG) if n > 0})


def _ranges(positions: list[int]) -> list[list[int]]:
    """[[first, last], ...] of consecutive runs in sorted `positions`."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    return runs


def _diagnose_wait(stuck: dict[int, dict[str, Any]], seconds: float) -> str:
    """Why the ring waited for ever, from the ranks' records of the sends and receives they posted."""
    from fourcard_helpers.exercises._traffic import describe_wait

    receiving = [r for r in stuck.values() if r["pending"] and all(op["op"] == "recv" for op in r["pending"])]
    cause = _("Every rank that waited was waiting to receive, so no rank was sending: a blocking `dist.recv` "
              "posted before the send it should pair with waits for ever when its neighbour does the same. "
              "Post the send first without blocking (`req = dist.isend(...)`, then `dist.recv(...)`, then "
              "`req.wait()`), or let even ranks send first and odd ranks receive first. That is enough on gloo, "
              "which this check runs on; on NCCL an ungrouped send may wait for its receive, so post each step's "
              "pair together with `dist.batch_isend_irecv([...])`.") \
        if len(receiving) == len(stuck) else \
        _("A send or receive that no rank matches waits for ever: every send needs a receive on its peer, "
          "posted in an order that lets both proceed.")
    return describe_wait(stuck, seconds) + "\n" + cause


def _diagnose(cases_by_rank: list[list[dict[str, Any]]], world: int) -> str:
    """The verdict, or CheckFailed naming the mistake, from every rank's cases."""
    from fourcard_helpers.check import CheckFailed

    by_length = {case["length"]: [cases[i] for cases in cases_by_rank]
                 for i, case in enumerate(cases_by_rank[0])}
    used = sorted({name for ranks in by_length.values() for case in ranks for name in case["collectives"]})
    if used:
        raise CheckFailed(_("your ring calls {used}: build it from `dist.send`/`dist.recv` (or `isend`/`irecv`) "
                            "alone; the check compares it with the built-in.").format(used=", ".join(used)))
    for length, ranks in by_length.items():
        if ranks[0]["shape"] != [length]:
            raise CheckFailed(_("for a tensor of {length} numbers your function left a result of shape {shape}: "
                                "it must sum the tensor in place (and return it).").format(
                                    length=length, shape=tuple(ranks[0]["shape"])))
    wrong = {length: ranks for length, ranks in by_length.items() if any(case["wrong"] for case in ranks)}
    if wrong:
        ranks_of = [case for ranks in wrong.values() for case in ranks if case["wrong"]]
        if all(case["averaged"] for case in ranks_of):
            raise CheckFailed(_("every wrong number is the sum divided by {world}: your ring averages. "
                                "all_reduce's default (and this exercise) is the sum; DDP divides by the "
                                "number of ranks afterwards, outside the collective.").format(world=world))
        full = [ranks for length, ranks in wrong.items() if length >= world]
        if full and all(sum(case["chunks_right"]) == 1 for ranks in full for case in ranks) and all(
                len({case["chunks_right"].index(True) for case in ranks}) == world for ranks in full):
            owned = ", ".join(_("rank {rank}: chunk {chunk}").format(rank=r, chunk=case["chunks_right"].index(True))
                              for r, case in enumerate(full[-1]))
            raise CheckFailed(_("each rank holds the right sum in one chunk only, a different one per rank "
                                "({owned}): the reduce-scatter is done, the all-gather is missing. Pass each "
                                "finished chunk round the ring {steps} more times, copying instead of adding.").format(
                                    owned=owned, steps=world - 1))
        length, ranks = max(wrong.items())                 # the longest: its wrong positions say the most
        bad_ranks = [r for r, case in enumerate(ranks) if case["wrong"]]
        spans = ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in ranks[bad_ranks[0]]["wrong_ranges"])
        unsummed = ranks[bad_ranks[0]]["unsummed"] == ranks[bad_ranks[0]]["wrong"]
        message = _("for a tensor of {length:,} numbers, ranks {ranks} are wrong at {count} of its positions ({spans}{more})."
                    ).format(length=length, ranks=bad_ranks, count=ranks[bad_ranks[0]]["wrong"], spans=spans,
                             more=", …" if len(ranks[bad_ranks[0]]["wrong_ranges"]) == 4 else "")
        if unsummed:
            message = sentences(message, _("Those positions still hold the rank's own numbers: no chunk covered them."))
        if all(length % world for length in wrong):
            right = [n for n in by_length if n not in wrong]
            message = sentences(message, _("The lengths that {world} divides are right ({right}); the others are not: your chunks "
                               "do not cover an uneven length. `tensor.tensor_split({world})` cuts any length into "
                               "{world} pieces whose lengths differ by one at most (some empty when the tensor is "
                               "shorter than {world}).").format(world=world, right=right))
        raise CheckFailed(message)
    copied = [length for length, ranks in by_length.items() if not all(case["in_place"] for case in ranks)]
    if copied:
        raise CheckFailed(_("for {lengths} numbers your function returned a new tensor with the right sums; the "
                            "argument was not summed in place, so the caller's tensor still holds its own numbers "
                            "(as `dist.all_reduce(tensor)` would not leave it). Work on `tensor` itself (its chunks "
                            "are views of it: `tensor.tensor_split(world)`), and return it.").format(
                                lengths=copied))
    ranks = by_length[max(by_length)]
    size = 8 * max(by_length)
    ring = 2 * (world - 1) / world * size
    total = sum(case["bytes"] for case in ranks)
    heaviest = max(range(world), key=lambda r: ranks[r]["bytes"])
    per_chunk = 8 * -(-max(by_length) // world)   # the longest chunk, in bytes
    if total > 2 * (world - 1) * size or ranks[heaviest]["bytes"] > 2 * (world - 1) * per_chunk:
        peers = sorted(int(peer) for peer in ranks[heaviest]["sends_to"])
        raise CheckFailed(_("the sums are right, but for {length:,} numbers rank {rank} sent {factor:.2f} × the tensor "
                            "(to ranks {peers}) where a ring sends 2({world}−1)/{world} = {ring:.2f} × per rank: "
                            "everything passes through one rank, whose link carries {world}−1 times what a "
                            "ring's does. Send each chunk to the next rank only, one chunk per step.").format(
                                length=max(by_length), rank=heaviest, factor=ranks[heaviest]["bytes"] / size,
                                peers=peers, world=world, ring=ring / size))
    far = [(r, sorted(int(peer) for peer in case["sends_to"])) for r, case in enumerate(ranks)
           if any(int(peer) not in ((r + 1) % world, (r - 1) % world) for peer in case["sends_to"])]
    if far:
        rank, peers = far[0]
        raise CheckFailed(_("the sums and the bytes are right, but for {length:,} numbers rank {rank} sent to ranks "
                            "{peers}: that is not a ring, whose ranks send only to a neighbour (rank + 1, and rank − 1 "
                            "in a ring run both ways). A direct exchange between every pair sends as many bytes but "
                            "needs a link from each card to every other; send each chunk to the next rank, one chunk "
                            "per step.").format(length=max(by_length), rank=rank, peers=peers))
    return _("equal to `dist.all_reduce` on all {world} ranks, to the bit (float64, integers), for lengths {lengths}; "
             "for {length:,} numbers each rank sent {low:.3f}–{high:.3f} × the tensor, {total:.2f} × in all over "
             "{world} ranks: 2({world}−1)/{world} = {ring:.2f} × per rank, where gathering on one rank makes that "
             "rank send {naive} ×.").format(
                 world=world, lengths=list(by_length), length=max(by_length),
                 low=min(c["bytes"] for c in ranks) / size, high=max(c["bytes"] for c in ranks) / size,
                 total=total / size, ring=ring / size, naive=world - 1)


def check(path: Path, nproc: int = 4, seconds: float = LIMIT_SECONDS) -> str:
    """Run the file's `ring_all_reduce` on `nproc` ranks; the verdict, or CheckFailed naming the mistake."""
    from fourcard_helpers.check import CheckFailed
    from fourcard_helpers.exercises import _traffic, harness

    harness.skeleton(path, DEFINES)
    result, stuck = _traffic.launch(__file__, path, nproc, seconds)
    if stuck:
        raise CheckFailed(_diagnose_wait(stuck, seconds))
    return _diagnose(result.values("cases"), nproc)


def _on_rank() -> None:
    """The ranks' side: run the learner's ring on every length and report what it did."""
    import torch
    import torch.distributed as dist

    from fourcard_helpers.exercises import _ranks
    from fourcard_helpers.exercises._traffic import Traffic, time_limit

    learner, device, parameters = _ranks.start()
    rank, world = dist.get_rank(), dist.get_world_size()
    traffic, cases = Traffic(), []
    for length in lengths(world):
        generator = torch.Generator().manual_seed(1000 * length + rank)   # positive integers: exact sums
        mine = torch.randint(1, 1000, (length,), generator=generator, dtype=torch.float64)
        expected = mine.clone().to(device)
        dist.all_reduce(expected)                                         # the built-in, as the reference
        tensor = mine.clone().to(device)
        traffic.clear()
        traffic.label = _ranks._phase = f"length {length}"
        dist.barrier()
        with time_limit(parameters["seconds"], sys.argv[3], traffic):
            with traffic.watch():
                returned = learner.ring_all_reduce(tensor)
            dist.barrier()
        out = (returned if isinstance(returned, torch.Tensor) else tensor).detach().cpu()
        expected = expected.cpu()
        case: dict[str, Any] = {"length": length, "bytes": traffic.bytes_sent(),
                                "sends_to": {str(k): v for k, v in traffic.sends_to().items()},
                                "collectives": sorted(set(traffic.collectives)), "shape": list(out.shape)}
        if out.shape == expected.shape:
            wrong = (out != expected).nonzero().flatten().tolist()
            case.update(wrong=len(wrong), wrong_ranges=_ranges(wrong)[:4],
                        in_place=bool(torch.equal(tensor.detach().cpu(), expected)),
                        unsummed=int((out[wrong] == mine[wrong]).sum()) if wrong else 0,
                        averaged=bool(wrong) and torch.allclose(out * world, expected, rtol=1e-12, atol=0),
                        chunks_right=[bool(torch.equal(a, b)) for a, b in
                                      zip(out.tensor_split(world), expected.tensor_split(world))])
        cases.append(case)
    _ranks.finish(cases=cases)


if __name__ == "__main__":  # what each rank runs (harness.launch starts this file with torchrun)
    _on_rank()
