"""Lesson 14's build exercises: ring attention's forward, from send/recv and the online softmax. The reference
passes, and each mistake a learner makes is named from what the ranks saw (real torchrun launches on gloo)."""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from fourcard_helpers.check import CheckFailed
from fourcard_helpers.exercises import ring_attention
from fourcard_helpers.solutions import attention
from helpers import mistake, write

ANSWER = "my_ring_attention.py"   # the file the learner's answer is in

RING = inspect.getsource(attention)


NOT_RESCALED = mistake(RING, "out = out * rescale + weights @ kv[1]", "out = out + weights @ kv[1]")

SKIPS_A_SEND = mistake(RING, "[dist.P2POp(dist.isend, kv, right),",
                       "[dist.P2POp(dist.isend, kv, right)] * bool(rank or step) + [")

AVERAGED = '''import torch
import torch.distributed as dist


def ring_attention(q, k, v):
    rank, world = dist.get_rank(), dist.get_world_size()
    kv, outs = torch.stack([k, v]), []
    for step in range(world):
        scores = q @ kv[0].transpose(-2, -1) / q.shape[-1] ** 0.5
        outs.append(torch.softmax(scores, -1) @ kv[1])     # each block's own attention...
        if step < world - 1:
            incoming = torch.empty_like(kv)
            sending = dist.isend(kv, (rank + 1) % world)
            dist.recv(incoming, (rank - 1) % world)
            sending.wait()
            kv = incoming
    return sum(outs) / world                              # ...averaged
'''

GATHERED = '''import torch
import torch.distributed as dist


def ring_attention(q, k, v):
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = torch.stack([k, v])
    blocks = [mine if r == rank else torch.empty_like(mine) for r in range(world)]
    sends = [dist.isend(mine, r) for r in range(world) if r != rank]
    receives = [dist.irecv(blocks[r], r) for r in range(world) if r != rank]
    for request in sends + receives:
        request.wait()
    kv = torch.cat(blocks, dim=2)                         # the whole sequence's keys and values
    return torch.softmax(q @ kv[0].transpose(-2, -1) / q.shape[-1] ** 0.5, -1) @ kv[1]
'''

# correct: keys and values as two messages, blocks sent left, merged by log-sum-exp; the list of each step's
# requests is replaced only once the next step's are posted, so for that moment it still refers to the block
# before last (a ring holds two blocks while it computes; the check weighs them when a transfer completes)
TWO_MESSAGES = '''import math
import torch
import torch.distributed as dist


def ring_attention(q, k, v):
    rank, world = dist.get_rank(), dist.get_world_size()
    to, source = (rank - 1) % world, (rank + 1) % world
    out = lse = None
    for step in range(world):
        if step < world - 1:
            next_k, next_v = torch.empty_like(k), torch.empty_like(v)
            requests = [dist.isend(k, to), dist.isend(v, to), dist.irecv(next_k, source), dist.irecv(next_v, source)]
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        block_lse = torch.logsumexp(scores, -1, keepdim=True)
        block_out = torch.softmax(scores, -1) @ v
        if out is None:
            out, lse = block_out, block_lse
        else:
            merged = torch.logaddexp(lse, block_lse)
            out = out * torch.exp(lse - merged) + block_out * torch.exp(block_lse - merged)
            lse = merged
        if step < world - 1:
            for request in requests:
                request.wait()
            k, v = next_k, next_v
    return out
'''

ONE_TRANSFER_TOO_MANY = RING.replace("if step < world - 1:", "if True:")

KEEPS_EVERY_REQUEST = mistake(RING, "    for step in range(world):\n", "    kept = []\n    for step in range(world):\n")
KEEPS_EVERY_REQUEST = mistake(KEEPS_EVERY_REQUEST, "lone send may wait\n",
                              "lone send may wait\n            kept.append(transfer)\n")


@pytest.mark.slow
def test_ring_attention_reference_passes_and_counts_the_blocks(tmp_path: Path) -> None:
    verdict = ring_attention.check(write(tmp_path, RING, ANSWER), nproc=4)
    block = 2 * ring_attention.HEADS * ring_attention.BLOCK * ring_attention.HEAD_DIM * 8
    assert "all 4 ranks" in verdict and f"3 blocks of keys and values of {block:,} B" in verdict
    assert "at most 2 received blocks" in verdict


@pytest.mark.slow
def test_ring_attention_passes_a_ring_that_replaces_its_requests_after_posting_the_next(tmp_path: Path) -> None:
    verdict = ring_attention.check(write(tmp_path, TWO_MESSAGES, ANSWER), nproc=4)   # 4 ranks: the block before last was received
    assert "all 4 ranks" in verdict and "at most 2 received blocks" in verdict


@pytest.mark.slow
@pytest.mark.parametrize("text, nproc, named", [
    (AVERAGED, 2, "each equals the plain average of the 2 blocks' own attention outputs"),
    (NOT_RESCALED, 2, "exactly those whose largest score rose after the first block"),
    (SKIPS_A_SEND, 2, r"Rank\(s\) \[0\] posted 0 send\(s\) where the other ranks posted 1"),
    (GATHERED, 4, r"sent to rank\(s\) \[.*, .*\], and held 3 received blocks at once.* is a gather"),
    (ONE_TRANSFER_TOO_MANY, 2, r"received 8,192 B .* one transfer too many"),
    (KEEPS_EVERY_REQUEST, 4, r"held 3 received blocks at once .* the requests of earlier steps"),
], ids=["averaged", "not-rescaled", "skips-a-send", "gathered", "one-transfer-too-many", "keeps-every-request"])
def test_ring_attention_names_each_mistake(tmp_path: Path, text: str, nproc: int, named: str) -> None:
    with pytest.raises(CheckFailed, match=named) as failure:   # a short time limit where the ring is meant to wait
        ring_attention.check(write(tmp_path, text, ANSWER), nproc=nproc, seconds=3.0 if text is SKIPS_A_SEND else 10.0)
    print(failure.value)


# Expert dispatch: the counts, the tokens (uneven splits), each card's experts, and the way back.
from fourcard_helpers.exercises import expert_dispatch  # noqa: E402
from fourcard_helpers.solutions import experts  # noqa: E402

DISPATCH = inspect.getsource(experts)

NO_COUNTS = mistake(DISPATCH, "    dist.all_to_all_single(received, send)  ",
                    "    received = send.clone()  ")
WRONG_ORDER = mistake(DISPATCH, "    out = torch.empty_like(x)\n    out[order] = weight[order, None] * results",
                      "    out = weight[order, None] * results")
WRONG_DIMENSION = mistake(DISPATCH, "to_rank = send.view(world, per_rank).sum(1)",
                          "to_rank = send.view(world, per_rank).sum(0)")
WRONG_DIMENSION = mistake(WRONG_DIMENSION, "from_rank = received.view(world, per_rank).sum(1)",
                          "from_rank = received.view(world, per_rank).sum(0)")
SKIPS_THE_COUNTS = mistake(DISPATCH, "    dist.all_to_all_single(received, send)  ",
                           "    if rank != 1:\n        dist.all_to_all_single(received, send)  ")
ALL_AT_HOME = "import torch\nimport torch.distributed as dist\n\n\ndef expert_dispatch(moe, x):\n    return moe(x)\n"


@pytest.mark.slow
def test_expert_dispatch_reference_passes_and_weighs_the_rows_that_leave(tmp_path: Path) -> None:
    verdict = expert_dispatch.check(write(tmp_path, DISPATCH, ANSWER), nproc=4)
    assert "all 4 ranks" in verdict and "rank 0, 48 B of counts" in verdict   # 3 other cards × 2 experts × 8 B


@pytest.mark.slow
@pytest.mark.parametrize("text, named", [
    (NO_COUNTS, "the tokens went out with no exchange of counts"),
    (WRONG_ORDER, "the output is permuted, in the order the tokens were sorted by expert"),
    (WRONG_DIMENSION, "summed over the wrong dimension"),
    (SKIPS_THE_COUNTS, r"rank\(s\) \[1\] never launched|differs between ranks"),
    (ALL_AT_HOME, r"rank 0 ran experts \[4, 5, 6, 7\], which live on other cards"),
], ids=["no-counts", "wrong-order", "wrong-dimension", "skips-the-counts", "all-at-home"])
def test_expert_dispatch_names_each_mistake(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(CheckFailed, match=named) as failure:
        expert_dispatch.check(write(tmp_path, text, ANSWER), nproc=2,
                              seconds=3.0 if text in (NO_COUNTS, SKIPS_THE_COUNTS) else 10.0)
    print(failure.value)
