"""Lesson 10's build exercise, clipping sharded gradients: the reference passes, the skeleton is "not attempted"
without a launch, and each mistake a learner makes is named from what the ranks saw. One launch of four ranks
grades the reference and every mistake (real torchrun, gloo). The skeleton's check and the cuts, which need no
launch, are in tests/unit/test_exercise_clipping_in_process.py."""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from fourcard_helpers.check import CheckFailed
from fourcard_helpers.exercises import sharded_clip
from fourcard_helpers.solutions import clipping
from helpers import mistake

SOLUTION = inspect.getsource(clipping)


GATHERED = SOLUTION.replace('''    squares = torch.stack([shard.pow(2).sum() for shard in shards]).sum()  # this rank's part of the sum of squares
    dist.all_reduce(squares, group=group)  # one number per rank: the whole gradient's sum of squares
    total = squares.sqrt()
''', '''    world = dist.get_world_size(group)
    mine = torch.cat(shards)
    sizes = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([mine.numel()]), group=group)
    longest = max(int(size) for size in sizes)
    padded = torch.cat([mine, mine.new_zeros(longest - mine.numel())])
    pieces = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(pieces, padded, group=group)  # every rank's shards, whole, to every rank
    total = torch.cat([piece[:int(size)] for piece, size in zip(pieces, sizes)]).norm()
''')

MISTAKES = {  # name: (the learner's file, what the check must say)
    "own shard's norm": (mistake(SOLUTION, "    dist.all_reduce(squares, group=group)", "    pass"),
                         "Each factor is max_norm over the norm of that rank's own shards"),
    "sum of norms": (mistake(SOLUTION, '''    squares = torch.stack([shard.pow(2).sum() for shard in shards]).sum()  # this rank's part of the sum of squares
    dist.all_reduce(squares, group=group)  # one number per rank: the whole gradient's sum of squares
    total = squares.sqrt()
''', '''    total = torch.stack([shard.pow(2).sum() for shard in shards]).sum().sqrt()  # this rank's norm
    dist.all_reduce(total, group=group)
'''), "It is the sum of the ranks' own norms"),
    "gathered whole": (GATHERED, "the gradients were gathered to measure their norm"),
    "not clamped": (mistake(SOLUTION, ".clamp(max=1.0)", ""), "clamp the factor to 1"),
    "local norm returned": (mistake(SOLUTION, "    dist.all_reduce(squares, group=group)", "    mine = squares.sqrt()\n"
                                    "    dist.all_reduce(squares, group=group)").replace("    return total\n",
                                                                                      "    return mine\n"),
                            ", each the norm of its own shards"),
    "no 1e-6": (mistake(SOLUTION, "(total + 1e-6)", "total"), "clip_grad_norm_ divides by norm + 1e-6"),
    "a copy scaled": (mistake(SOLUTION, "    for shard in shards:\n        shard.mul_(factor)\n",
                              "    shards = [shard * factor for shard in shards]\n"),
                      "The shards passed in are unchanged: scale them in place"),
    "list entries replaced": (mistake(SOLUTION, "    for shard in shards:\n        shard.mul_(factor)\n",
                                      "    for i, shard in enumerate(shards):\n        shards[i] = shard * factor\n"),
                              "The list's entries were replaced by new tensors"),
    "float32 sum": (mistake(SOLUTION, "    squares = torch.stack([shard.pow(2).sum() for shard in shards]).sum()",
                            "    squares = torch.tensor([sum(float(shard.pow(2).sum()) for shard in shards)])"),
                    "The norm returned is a torch.float32 tensor"),
    "squares averaged": (mistake(SOLUTION, "dist.all_reduce(squares, group=group)",
                                 "dist.all_reduce(squares, op=dist.ReduceOp.AVG, group=group)"),
                         "the squares were averaged over the ranks, not summed"),
}


def test_the_mistakes_are_changes_of_the_reference() -> None:
    assert GATHERED != SOLUTION and len({text for text, _ in MISTAKES.values()}) == len(MISTAKES)


@pytest.mark.slow
def test_the_reference_passes_and_each_mistake_is_named(tmp_path: Path) -> None:
    """One launch of four ranks grades the reference and every mistake."""
    paths = []
    for k, text in enumerate([SOLUTION] + [text for text, _ in MISTAKES.values()]):
        paths.append(tmp_path / f"answer{k}.py")
        paths[-1].write_text(text, encoding="utf-8")
    verdict, *failures = sharded_clip.grade(paths, nproc=4)
    assert isinstance(verdict, str), verdict
    assert "4 ranks" in verdict and "to the bit" in verdict and "1 number(s) per call, where the gradient has 279" in verdict
    for (name, (_, said)), failure in zip(MISTAKES.items(), failures):
        assert isinstance(failure, CheckFailed) and said in str(failure), (name, failure)
