"""Lesson 06's build exercise, a ring all-reduce from send/recv: the reference passes, and each
mistake a learner makes is named from what the ranks saw (real torchrun launches on gloo)."""
from __future__ import annotations

import inspect

import pytest

from fourcard_helpers.check import CheckFailed
from fourcard_helpers.exercises import ring
from fourcard_helpers.solutions import ring as reference
from helpers import write

ANSWER = "my_ring.py"   # the file the learner's answer is in

HEADER = "import torch\nimport torch.distributed as dist\n\n"
SOLUTION = inspect.getsource(reference)

DEADLOCK = HEADER + '''
def ring_all_reduce(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.tensor_split(world))
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        send, recv = (rank - step) % world, (rank - step - 1) % world
        incoming = torch.empty_like(chunks[recv])
        dist.recv(incoming, left)          # every rank receives first: nobody sends
        dist.send(chunks[send], right)
        chunks[recv] += incoming
    return tensor
'''

EVEN_CHUNKS = SOLUTION.replace(
    "chunks = list(tensor.tensor_split(world))",
    "size = tensor.numel() // world\n    chunks = [tensor[i * size:(i + 1) * size] for i in range(world)]")

REDUCE_SCATTER_ONLY = SOLUTION.replace("    for step in range(world - 1):             # all-gather",
                                       "    for step in range(0):             # all-gather")

AVERAGE = SOLUTION.replace("    return tensor\n", "    return tensor.div_(world)\n", 1)

GATHER_ON_ZERO = HEADER + '''
def ring_all_reduce(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        for other in range(1, world):
            incoming = torch.empty_like(tensor)
            dist.recv(incoming, other)
            tensor += incoming
        for other in range(1, world):
            dist.send(tensor, other)
    else:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)
    return tensor
'''

OUT_OF_PLACE = HEADER + '''
def ring_all_reduce(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = tensor.clone()                  # works on a copy: the caller's tensor is left as it was
    chunks = list(out.tensor_split(world))
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(2 * (world - 1)):
        send, recv = (rank - step) % world, (rank - step - 1) % world
        incoming = torch.empty_like(chunks[recv])
        request = dist.isend(chunks[send].clone(), right)
        dist.recv(incoming, left)
        request.wait()
        if step < world - 1:
            chunks[recv] += incoming
        else:
            chunks[recv].copy_(incoming)
    return out
'''

PAIRWISE = HEADER + '''
def ring_all_reduce(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = tensor.tensor_split(world)
    others = [r for r in range(world) if r != rank]
    incoming = {r: torch.empty_like(chunks[rank]) for r in others}
    requests = [dist.isend(chunks[r].clone(), r) for r in others] + [dist.irecv(incoming[r], r) for r in others]
    for request in requests:
        request.wait()
    for r in others:                      # every rank sums its own chunk from every other rank directly...
        chunks[rank].add_(incoming[r])
    requests = [dist.isend(chunks[rank], r) for r in others] + [dist.irecv(chunks[r], r) for r in others]
    for request in requests:              # ...and sends it to every other: the ring's bytes, but no ring
        request.wait()
    return tensor
'''

BUILT_IN = HEADER + "def ring_all_reduce(tensor):\n    dist.all_reduce(tensor)\n    return tensor\n"


def test_the_mistakes_change_the_reference():
    # each mistake file is the reference with one change (or a different program): the replacements took
    for text in (EVEN_CHUNKS, REDUCE_SCATTER_ONLY, AVERAGE):
        assert text != SOLUTION


@pytest.mark.slow
def test_reference_passes_and_counts_the_ring_bytes(tmp_path):
    verdict = ring.check(write(tmp_path, SOLUTION, ANSWER), nproc=4)
    assert "1.500–1.500 × the tensor" in verdict and "4 ranks" in verdict


@pytest.mark.slow
@pytest.mark.parametrize("text, nproc, named", [
    (DEADLOCK, 2, "Every rank that waited was waiting to receive"),
    (EVEN_CHUNKS, 2, "your chunks do not cover an uneven length"),
    (REDUCE_SCATTER_ONLY, 2, "the all-gather is missing"),
    (AVERAGE, 2, "your ring averages"),
    (GATHER_ON_ZERO, 4, "everything passes through one rank"),
    (BUILT_IN, 2, "your ring calls all_reduce"),
    (OUT_OF_PLACE, 2, "returned a new tensor with the right sums; the argument was not summed in place"),
    (PAIRWISE, 4, "rank 0 sent to ranks [1, 2, 3]: that is not a ring"),
], ids=["deadlock", "uneven-chunks", "reduce-scatter-only", "average", "gather-on-zero", "built-in", "out-of-place",
        "pairwise"])
def test_each_mistake_is_named(tmp_path, text, nproc, named):
    with pytest.raises(CheckFailed, match=named.replace("(", r"\(").replace("[", r"\[")) as failure:
        ring.check(write(tmp_path, text, ANSWER), nproc=nproc, seconds=3.0)
    print(failure.value)
