"""Checks for the exercises: say what is right, or what is off and by how much.

An exercise in a notebook looks like this:

    def weighted_average(grads, sizes):      # the learner's cell
        raise NotImplementedError

    check.exercise("weighted average", lambda: check.close(weighted_average(g, n), reference))

    %%solution                               # a hidden cell below (click to reveal)
    def weighted_average(grads, sizes): ...
    check.exercise("weighted average", lambda: check.close(weighted_average(g, n), reference))

A learner who has not written the answer yet sees "not attempted"; a wrong answer shows
what was expected. The hidden `%%solution` cell (see magic.py) runs the same check on the
reference answer in a copy of the notebook's namespace: "Run All" proves the exercise can be
solved without overwriting the learner's attempt with the solution.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

_reference_verdicts: list[str] | None = None  # while a %%solution cell runs: exercise() records its verdict here


class CheckFailed(AssertionError):
    """An exercise answer is not right yet; the message says how it differs."""


def _as_tensor(value: Any) -> torch.Tensor:
    return value.detach().cpu() if isinstance(value, torch.Tensor) else torch.as_tensor(value)


def close(actual: Any, expected: Any, what: str = "your answer", atol: float = 1e-6, rtol: float = 1e-5) -> None:
    """Raise CheckFailed unless `actual` matches `expected` (numbers, lists or tensors)."""
    got, want = _as_tensor(actual).double(), _as_tensor(expected).double()
    if got.shape != want.shape:
        raise CheckFailed(f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    if not torch.allclose(got, want, atol=atol, rtol=rtol):
        gap = (got - want).abs().max().item()
        raise CheckFailed(f"{what}: differs from the expected value by up to {gap:.3g} (tolerance {atol:g} + {rtol:g}·|x|)")


def equal(actual: Any, expected: Any, what: str = "your answer") -> None:
    """Raise CheckFailed unless `actual == expected` exactly."""
    if isinstance(actual, torch.Tensor) or isinstance(expected, torch.Tensor):
        same = torch.equal(_as_tensor(actual), _as_tensor(expected))
    else:
        same = actual == expected
    if not same:
        raise CheckFailed(f"{what}: got {actual!r}, expected {expected!r}")


def exercise(name: str, test: Callable[[], Any]) -> None:
    """Run an exercise's test and say how it went (returns nothing, so a cell shows only that).

    NotImplementedError means "not attempted yet" and is not an error; a wrong answer
    raises CheckFailed, so a notebook run top to bottom stops on it.
    """
    if _reference_verdicts is not None:
        test()  # a reference solution that fails its own check is a bug in the lesson: raise
        _reference_verdicts.append(f"✓ {name}: the reference solution passes this check. Your own answer above "
                                   "is untouched; click this cell's margin to read the solution.")
        return
    try:
        test()
    except NotImplementedError:
        print(f"○ {name}: not attempted yet. Write your answer above and run this cell again.")
        return
    except CheckFailed as failure:
        print(f"✗ {name}: not yet. {failure}")
        raise
    print(f"✓ {name}: correct.")


@contextmanager
def reference_solution() -> Iterator[list[str]]:
    """While active, `exercise()` checks a reference solution rather than the learner's answer,
    and collects its verdicts in the yielded list instead of printing them."""
    global _reference_verdicts
    before, _reference_verdicts = _reference_verdicts, []
    try:
        yield _reference_verdicts
    finally:
        _reference_verdicts = before
