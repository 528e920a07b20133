"""Checks for the exercises: say what is right, or what is off and by how much.

An exercise in a notebook looks like this:

    def weighted_average(grads, sizes):      # the learner's cell
        raise NotImplementedError

    check.exercise("weighted average", lambda: check.close(weighted_average(g, n), reference))

    %%solution                               # a hidden cell below (click to reveal)
    def weighted_average(grads, sizes): ...
    check.exercise("weighted average", lambda: check.close(weighted_average(g, n), reference))

A learner who has not written the answer yet sees "not attempted"; a wrong answer shows
what was expected. An exercise that asks for a launch checks the launch's result; a check that
finds none raises `NotLaunched`, and the learner reads that no launch has succeeded yet rather
than that nothing was attempted, which would mislead one whose launch has just failed.

The hidden `%%solution` cell (see magic.py) runs the same check on the reference answer in a
copy of the notebook's namespace: "Run All" proves the exercise can be solved without
overwriting the learner's attempt with the solution.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from .language import _

_reference_verdicts: list[str] | None = None  # while a %%solution cell runs: exercise() records its verdict here


class CheckFailed(AssertionError):
    """An exercise answer is not right yet; the message says how it differs."""


class NotLaunched(NotImplementedError):
    """An exercise's launch has left no result: its cell has not run, or the launch failed."""


def _as_tensor(value: Any) -> torch.Tensor:
    return value.detach().cpu() if isinstance(value, torch.Tensor) else torch.as_tensor(value)


def close(actual: Any, expected: Any, what: str | None = None, atol: float = 1e-6, rtol: float = 1e-5) -> None:
    """Raise CheckFailed unless `actual` matches `expected` (numbers, lists or tensors)."""
    what = what or _("your answer")
    got, want = _as_tensor(actual).double(), _as_tensor(expected).double()
    if got.shape != want.shape:
        raise CheckFailed(_("{what}: shape {got}, expected {want}").format(
            what=what, got=tuple(got.shape), want=tuple(want.shape)))
    if not torch.allclose(got, want, atol=atol, rtol=rtol):
        gap = (got - want).abs().max().item()
        raise CheckFailed(_("{what}: differs from the expected value by up to {gap} (tolerance {atol} + {rtol}·|x|)").format(
            what=what, gap=f"{gap:.3g}", atol=f"{atol:g}", rtol=f"{rtol:g}"))


def equal(actual: Any, expected: Any, what: str | None = None) -> None:
    """Raise CheckFailed unless `actual == expected` exactly."""
    what = what or _("your answer")
    if isinstance(actual, torch.Tensor) or isinstance(expected, torch.Tensor):
        same = torch.equal(_as_tensor(actual), _as_tensor(expected))
    else:
        same = actual == expected
    if not same:
        raise CheckFailed(_("{what}: got {actual}, expected {expected}").format(
            what=what, actual=repr(actual), expected=repr(expected)))


def exercise(name: str, test: Callable[[], Any]) -> None:
    """Run an exercise's test and say how it went (returns nothing, so a cell shows only that).

    NotImplementedError means "not attempted yet" and is not an error, nor is NotLaunched
    (no successful launch yet); a wrong answer raises CheckFailed, so a notebook run top to
    bottom stops on it. The lessons' titles ("Exercise 1: ...") are in the package's catalog too
    (docs/translate.py collects them from the notebooks), so a Chinese verdict names its exercise in Chinese.
    """
    name = _(name)
    if _reference_verdicts is not None:
        test()  # a reference solution that fails its own check is a bug in the lesson: raise
        _reference_verdicts.append("✓ " + _("{name}: the reference solution passes this check. Your own answer "
                                            "above is untouched; click this cell's margin to read the solution."
                                            ).format(name=name))
        return
    try:
        verdict = test()
    except NotLaunched:
        print("○ " + _("{name}: no successful launch yet. If the launch cell above ended with an error, fix what it "
                       "names and run that cell again; then run this one.").format(name=name))
        return
    except NotImplementedError:
        print("○ " + _("{name}: not attempted yet. Write your answer above and run this cell again.").format(name=name))
        return
    except CheckFailed as failure:
        print("✗ " + _("{name}: not yet. {failure}").format(name=name, failure=failure))
        raise
    print("✓ " + _("{name}: correct.").format(name=name))
    if isinstance(verdict, str):  # a build exercise's check says what it measured (exercises/)
        print(verdict)


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


if __name__ == "__main__":  # python -m fourcard_helpers.check EXERCISE FILE.py: a build exercise from a terminal
    import sys

    from fourcard_helpers.exercises import main

    sys.exit(main(sys.argv[1:]))
