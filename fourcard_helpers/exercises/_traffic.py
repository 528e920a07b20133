"""What a rank's point-to-point calls did, and where a rank waits for ever: the evidence that the
build exercises on send/recv (the ring of lesson 06, the pipeline of lesson 07) read.

A learner's ring or pipeline that posts its sends and receives in the wrong order does not fail:
it waits. So every rank of these checks runs the learner's code under a time limit; when it
passes, each rank writes down the sends and receives it posted that never completed, and the
notebook's side reads the ranks' records and names the wait (`stuck_records`), instead of a cell
that never ends. Standard library and torch only: it runs in the ranks.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ..lifecycle import wait_until
from ..rundir import STUCK, RunDir

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
               "all_to_all_single", "broadcast", "broadcast_object_list", "gather", "gather_object", "reduce",
               "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list")
# A rank whose limit passed waits for every rank's record before it exits (its exit ends the launch). The ranks
# start their limits together, after a barrier, but a loaded machine may run a rank's timer seconds late: the wait
# is for the records, and this bound only keeps a rank that left the block by an error from holding the check.
RECORDS_BOUND_SECONDS = 60.0


class _Watched:
    """A send's or receive's request: marks the operation done when `wait()` returns."""

    def __init__(self, work: Any, op: dict[str, Any], traffic: Traffic) -> None:
        self._work, self._op, self._traffic = work, op, traffic

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self._op["waiting"] = True
        result = self._work.wait(*args, **kwargs)
        self._op["done"] = True
        self._traffic.completed(self._op)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class Traffic:
    """Every send and receive this rank posts (through `isend`/`irecv`, which `send`, `recv` and
    `batch_isend_irecv` call too), and every collective it calls, while `watch()` is active."""

    def __init__(self) -> None:
        self.ops: list[dict[str, Any]] = []
        self.collectives: list[str] = []
        self.label = ""  # what the rank is doing, for the record of a wait

    def bytes_sent(self) -> int:
        return sum(op["bytes"] for op in self.ops if op["op"] == "send")

    def sends_to(self) -> dict[int, int]:
        """{peer: bytes sent to it}."""
        sent: dict[int, int] = {}
        for op in self.ops:
            if op["op"] == "send":
                sent[op["peer"]] = sent.get(op["peer"], 0) + op["bytes"]
        return sent

    def pending(self) -> list[dict[str, Any]]:
        """What the rank waits on: the receives not yet over, and the sends it is waiting for (a send that
        nobody waited for yet may well have gone: gloo says it is complete only once waited for)."""
        return [op for op in self.ops if not op["done"] and (op["op"] == "recv" or op["waiting"])]

    def clear(self) -> None:
        self.ops.clear()
        self.collectives.clear()

    def completed(self, op: dict[str, Any]) -> None:
        """Called when a send or receive is waited for and done (a blocking `send`/`recv` waits too): what an
        exercise measures at that moment, in a subclass."""

    def _post(self, kind: str, real: Any, tensor: torch.Tensor, peer: int | None, *args: Any, **kwargs: Any) -> Any:
        """Record the operation, then post it as torch would (`send` and `recv` pass the peer as group_dst/src)."""
        named = peer if peer is not None else kwargs.get("group_dst" if kind == "send" else "group_src")
        op = {"op": kind, "peer": named, "numel": tensor.numel(), "bytes": tensor.numel() * tensor.element_size(),
              "done": False, "waiting": False, "during": self.label}
        self.ops.append(op)
        work = real(tensor, peer, *args, **kwargs)
        return None if work is None else _Watched(work, op, self)

    @contextmanager
    def watch(self) -> Iterator[Traffic]:
        """Record, while active, what the learner's code posts; what was installed before comes back after."""
        real = {name: getattr(c10d, name) for name in ("isend", "irecv")}

        def isend(tensor: torch.Tensor, dst: int | None = None, *args: Any, **kwargs: Any) -> Any:
            return self._post("send", real["isend"], tensor, dst, *args, **kwargs)

        def irecv(tensor: torch.Tensor, src: int | None = None, *args: Any, **kwargs: Any) -> Any:
            return self._post("recv", real["irecv"], tensor, src, *args, **kwargs)

        def counting(name: str, collective: Any) -> Any:
            def counted(*args: Any, **kwargs: Any) -> Any:
                self.collectives.append(name)
                return collective(*args, **kwargs)
            return counted

        before = {(module, name): getattr(module, name) for module in (dist, c10d) for name in ("isend", "irecv")}
        before.update({(dist, name): getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)})
        # `send`/`recv` call c10d's isend/irecv, and P2POp and batch_isend_irecv compare an operation
        # with them: patch both modules
        for module in (dist, c10d):
            module.isend, module.irecv = isend, irecv
        for name in COLLECTIVES:
            if hasattr(dist, name):
                setattr(dist, name, counting(name, getattr(dist, name)))
        try:
            yield self
        finally:
            for (module, name), function in before.items():
                setattr(module, name, function)


def _count(peers: Iterator[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for peer in peers:
        counts[str(peer)] = counts.get(str(peer), 0) + 1
    return counts


@contextmanager
def time_limit(seconds: float, folder: str | os.PathLike[str], traffic: Traffic) -> Iterator[None]:
    """End this rank if the block has not finished after `seconds`, leaving `stuck.<rank>` in
    `folder`: what the rank was doing and the sends and receives it posted that never completed."""
    rank, world = dist.get_rank(), dist.get_world_size()

    def give_up() -> None:
        record = {"rank": rank, "during": traffic.label, "pending": traffic.pending(),
                  "posted": {kind: sum(op["op"] == kind for op in traffic.ops) for kind in ("send", "recv")},
                  "sends_posted_to": _count(op["peer"] for op in traffic.ops if op["op"] == "send"),
                  "received_from": _count(op["peer"] for op in traffic.ops if op["op"] == "recv" and op["done"])}
        RunDir(folder).write_json(STUCK, rank, record)  # whole or not at all, as the kernel reads it
        with suppress(TimeoutError):  # the other ranks' limits pass meanwhile: each writes its own record
            wait_until(lambda: len(stuck_records(folder)) >= world, RECORDS_BOUND_SECONDS)
        os._exit(3)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def stuck_records(folder: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """{rank: record} of the ranks whose time limit passed (read on the notebook's side)."""
    return RunDir(folder).read_json(STUCK)


def launch(exercise_file: str, path: Path, nproc: int, seconds: float, **parameters: Any
           ) -> tuple[Any, dict[int, dict[str, Any]]]:
    """Run the exercise's file on `nproc` ranks with the learner's file, as `harness.launch` does (the same
    arguments for `_ranks.start`, its `parameters` plus `seconds`), but read a failed launch from the ranks'
    own records first: (the launch's result, {}) or (None, {rank: record} of the ranks that waited too long).
    Another failure raises CheckFailed with the rank's error. (Matching sends by position across ranks, as
    `harness.skipped_collective` matches collectives, would misread a ring: its ranks' sends differ.)"""
    from ..check import CheckFailed
    from ..diagnose import LaunchError
    from ..language import _
    from ..launch import torchrun
    from .harness import COLLECTIVE_TIMEOUT, LAUNCH_TIMEOUT

    folder = Path(tempfile.mkdtemp(prefix="fourcard-exercise-"))
    parameters = {"collective_timeout": COLLECTIVE_TIMEOUT, "seconds": seconds, **parameters}
    try:
        try:
            result = torchrun(Path(exercise_file), nproc=nproc, timeout=LAUNCH_TIMEOUT,
                              echo=False, doctor=False, args=[str(Path(path).resolve()), json.dumps(parameters),
                                                              str(folder)])
        except LaunchError as error:
            stuck = stuck_records(folder)
            if stuck:
                return None, stuck
            raise CheckFailed(_("a rank failed while running your code. {error}").format(error=error)) from None
        return result, {}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _one_wait(record: dict[str, Any]) -> str:
    from ..language import _

    waits = [(_("a send to rank {peer}") if op["op"] == "send" else _("a recv from rank {peer}")).format(peer=op["peer"])
             for op in record["pending"]]
    if not waits:
        return _("rank {rank} had finished its own calls and waited for the others").format(rank=record["rank"])
    return _("rank {rank} waited on {waits} (it had posted {sends} sends and {recvs} receives)").format(
        rank=record["rank"], waits=", ".join(waits), sends=record["posted"]["send"], recvs=record["posted"]["recv"])


def describe_wait(stuck: dict[int, dict[str, Any]], seconds: float) -> str:
    """What the ranks whose time limit passed were waiting on, one line each (the exercise adds the cause)."""
    from ..language import _

    lines = [_one_wait(stuck[rank]) for rank in sorted(stuck)]
    return _("no rank finished within {seconds:g} s ({during}); the ranks' own records:\n  {lines}").format(
        seconds=seconds, during=next(iter(stuck.values()))["during"], lines="\n  ".join(lines))
