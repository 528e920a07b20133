"""The send/recv references of lessons 06 and 07, and lesson 14's rings, cannot wait for ever on NCCL.

gloo lets a send finish before its receive is posted; NCCL may not, and runs a rank's point-to-point
operations in the order they were started. So the references are replayed here, one thread per rank,
against a `dist` that keeps NCCL's worst case: a batch of operations starts only when the rank's
previous one has finished, and a send finishes only once its receive is posted. A reference whose
ranks can both wait on a send to each other stops at the time limit instead of finishing.
"""
from __future__ import annotations

import inspect
import threading
from typing import Any

import pytest
import torch

from fourcard_helpers import ring as ring_lesson
from fourcard_helpers.solutions import pipeline, ring

LIMIT_SECONDS = 20.0  # a run that finishes takes milliseconds


class StrictP2P:
    """torch.distributed's point-to-point calls for `world` threads, with rendezvous semantics."""

    def __init__(self, world: int, limit: float) -> None:
        self.world, self.limit, self.local = world, limit, threading.local()
        self.changed = threading.Condition()
        self.sends: dict[tuple[int, int, int], torch.Tensor] = {}  # (src, dst, k): the k-th message src → dst
        self.receives: set[tuple[int, int, int]] = set()
        self.counts: dict[tuple[str, int, int], int] = {}

    def get_rank(self) -> int:
        return self.local.rank

    def get_world_size(self) -> int:
        return self.world

    def isend(self, tensor: torch.Tensor, peer: int) -> Any:
        return self.batch_isend_irecv([self.P2POp(self.isend, tensor, peer)])[0]

    def irecv(self, tensor: torch.Tensor, peer: int) -> Any:
        return self.batch_isend_irecv([self.P2POp(self.irecv, tensor, peer)])[0]

    def send(self, tensor: torch.Tensor, peer: int) -> None:
        self.isend(tensor, peer).wait()

    def recv(self, tensor: torch.Tensor, peer: int) -> None:
        self.irecv(tensor, peer).wait()

    class P2POp:
        def __init__(self, op: Any, tensor: torch.Tensor, peer: int) -> None:
            self.op, self.tensor, self.peer = op, tensor, peer

    def batch_isend_irecv(self, ops: list[Any]) -> list[Any]:
        rank = self.local.rank
        for work in getattr(self.local, "started", []):  # one stream: the previous batch ends first
            work.wait()
        works = []
        with self.changed:
            for op in ops:
                sending = op.op == self.isend
                src, dst = (rank, op.peer) if sending else (op.peer, rank)
                kind = "send" if sending else "recv"
                k = self.counts[(kind, src, dst)] = self.counts.get((kind, src, dst), 0) + 1
                if sending:
                    self.sends[(src, dst, k)] = op.tensor.detach().clone()
                else:
                    self.receives.add((src, dst, k))
                works.append(_Work(self, (src, dst, k), None if sending else op.tensor))
            self.changed.notify_all()
        self.local.started = works
        return works


class _Work:
    def __init__(self, p2p: StrictP2P, key: tuple[int, int, int], into: torch.Tensor | None) -> None:
        self.p2p, self.key, self.into, self.done = p2p, key, into, False

    def wait(self) -> None:
        if self.done:
            return
        with self.p2p.changed:
            ready = (lambda: self.key in self.p2p.sends) if self.into is not None else \
                (lambda: self.key in self.p2p.receives)
            if not self.p2p.changed.wait_for(ready, timeout=self.p2p.limit):
                raise TimeoutError(f"message {self.key} (src, dst, number) never matched")
            if self.into is not None:
                with torch.no_grad():
                    self.into.copy_(self.p2p.sends[self.key])
        self.done = True


def replay(source: str, world: int, run: Any, limit: float = LIMIT_SECONDS) -> list[Any]:
    """Run `run(namespace, rank)` on `world` threads, each a rank, where `source` (a reference module's text)
    was run with a StrictP2P as its `dist`."""
    p2p = StrictP2P(world, limit)
    namespace: dict[str, Any] = {"__name__": "replayed"}
    exec(compile(source, "replayed", "exec"), namespace)
    namespace["dist"] = p2p
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        p2p.local.rank = rank
        try:
            results[rank] = run(namespace, rank)
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("world, micro_batches", [(2, 4), (3, 2), (4, 8), (4, 3)])
def test_the_1f1b_reference_cannot_wait_for_ever_on_nccl(world: int, micro_batches: int) -> None:
    torch.manual_seed(0)
    blocks = [torch.nn.Linear(3, 3).double() for _ in range(world)]
    x, t = torch.randn(2 * micro_batches, 3, dtype=torch.float64), torch.randn(2 * micro_batches, 3,
                                                                             dtype=torch.float64)
    losses = replay(inspect.getsource(pipeline), world, lambda ns, rank: ns["one_f_one_b"](
        blocks[rank], x if rank == 0 else None, t if rank == world - 1 else None, micro_batches, (2, 3),
        torch.nn.functional.mse_loss))
    one_card = torch.nn.functional.mse_loss(torch.nn.Sequential(*blocks)(x), t)
    assert torch.allclose(losses[-1], one_card, rtol=1e-12, atol=0)


def test_a_send_posted_before_a_blocking_receive_waits_for_ever_here() -> None:
    """The replay can fail: the earlier reference, an unpaired isend before the receive, stops at the limit."""
    unpaired = inspect.getsource(ring).replace(
        """        for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, outgoing, right),
                                               dist.P2POp(dist.irecv, incoming, left)]):
            request.wait()""", """        request = dist.isend(outgoing, right)
        dist.recv(incoming, left)
        request.wait()""")
    assert unpaired != inspect.getsource(ring)
    with pytest.raises(TimeoutError, match="never matched"):
        replay(unpaired, 2, lambda ns, rank: ns["ring_all_reduce"](torch.ones(8)), limit=1.0)


@pytest.mark.parametrize("world, length", [(2, 5), (4, 1), (4, 13)])
def test_the_ring_reference_cannot_wait_for_ever_on_nccl(world: int, length: int) -> None:
    results = replay(inspect.getsource(ring), world, lambda ns, rank: ns["ring_all_reduce"](torch.arange(length, dtype=torch.float64)
                                                                          + rank))
    expected = sum(torch.arange(length, dtype=torch.float64) + rank for rank in range(world))
    assert all(torch.equal(result, expected) for result in results)


@pytest.mark.parametrize("world", [2, 4])
def test_the_lean_ring_attention_cannot_wait_for_ever_on_nccl(world: int) -> None:
    """Lesson 14's two rings, forward and backward, replayed with NCCL's order: the lean ring posts a block's keys and
    values while the gradients it posted a step earlier may still be travelling. Every rank finishes, each ring equal
    to one card's attention in float64."""
    length, heads, d = 8 * world, 2, 4
    torch.manual_seed(0)
    q, k, v, grad_out = (torch.randn(heads, length, d, dtype=torch.float64) for _ in range(4))
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    (torch.nn.functional.scaled_dot_product_attention(*whole, is_causal=True) * grad_out).sum().backward()

    def run(namespace: dict, rank: int) -> list[list[torch.Tensor]]:
        mine = torch.cat(namespace["chunk_positions"](rank, world, length, True))
        results = []
        for attention in (namespace["LeanRingAttention"].apply, namespace["ring_attention"]):
            parts = [t[:, mine].clone().requires_grad_() for t in (q, k, v)]
            out = attention(*parts, length, True)
            (out * grad_out[:, mine]).sum().backward()
            results.append([mine, out.detach()] + [t.grad for t in parts])
        return results

    expected = [torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)] + [t.grad for t in whole]
    for rank_results in replay(inspect.getsource(ring_lesson), world, run):
        for mine, out, *grads in rank_results:
            for got, want in zip([out, *grads], expected):
                assert (got - want[:, mine]).abs().max() <= 1e-12


def test_the_replay_catches_a_lean_ring_whose_gradients_stay_away() -> None:
    """The check can fail: a lean ring that forgets to add the gradients coming home misses one card's dK and dV."""
    source = inspect.getsource(ring_lesson)
    broken = source.replace("own = own + gradients_arriving()", "own = own + 0 * gradients_arriving()")
    assert broken != source
    q, k, v = (torch.randn(2, 16, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(s)) for s in range(3))
    whole = [t.clone().requires_grad_() for t in (k, v)]
    torch.nn.functional.scaled_dot_product_attention(q, *whole, is_causal=True).sum().backward()

    def run(namespace: dict, rank: int) -> float:
        mine = torch.cat(namespace["chunk_positions"](rank, 2, 16, True))
        parts = [t[:, mine].clone().requires_grad_() for t in (q, k, v)]
        namespace["LeanRingAttention"].apply(*parts, 16, True).sum().backward()
        return max((p.grad - w.grad[:, mine]).abs().max().item() for p, w in zip(parts[1:], whole))

    assert min(replay(broken, 2, run)) > 1e-3
