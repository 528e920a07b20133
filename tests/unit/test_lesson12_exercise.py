"""Lesson 12's Exercise 2 check must fail on the point it teaches: the reference solution passes,
and an answer that does not resume, does not save atomically, or forgets the optimizer fails.
The check runs in-process (no torchrun): the lesson's own cells, executed here.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from fourcard_helpers import check
from helpers import NOTEBOOKS, code_cell, definitions

LESSON = next(p for p in NOTEBOOKS if p.stem == "12_beyond_one_machine")


REFERENCE = definitions(code_cell(LESSON, "%%solution\ndef train(").split("\n", 1)[1])


@pytest.fixture
def namespace() -> dict:
    ns: dict = {}
    exec("import shutil\nfrom pathlib import Path\nimport torch\nfrom fourcard_helpers import check", ns)  # noqa: S102
    exec(code_cell(LESSON, "class Crash(Exception)"), ns)  # noqa: S102 - make_run, batch, Crash
    exec(definitions(code_cell(LESSON, "def test_train(")), ns)  # noqa: S102 - the check itself
    return ns


def answer(ns: dict, text: str):
    exec(text, ns)  # noqa: S102
    return ns["train"]


def wrong(old: str, new: str) -> str:
    assert old in REFERENCE, f"the reference solution no longer contains {old!r}: update this test"
    return REFERENCE.replace(old, new)


def test_the_reference_solution_passes(namespace: dict, tmp_path: Path) -> None:
    namespace["test_train"](answer(namespace, REFERENCE), folder=tmp_path / "run")


def test_the_stub_counts_as_not_attempted(namespace: dict, tmp_path: Path) -> None:
    with pytest.raises(NotImplementedError):
        namespace["test_train"](answer(namespace, definitions(code_cell(LESSON, "# your code here: resume"))), folder=tmp_path / "run")


@pytest.mark.parametrize("old, new, complaint", [
    ("if os.path.exists(checkpoint):", "if False:", "reached step 3 again"),                          # never resumes
    ("}, partial)", "}, checkpoint)", "crash in the middle of a save"),                                # not atomic
    ('optimizer.load_state_dict(saved["optimizer"])', "pass", "after two crashes and a resume"),      # no momentum
    ("start = saved[\"step\"] + 1", "start = 0", "reached step 3 again"),                              # loads, redoes all
], ids=["no-resume", "not-atomic", "no-optimizer-state", "restarts-from-0"])
def test_a_wrong_answer_fails(namespace: dict, tmp_path: Path, old: str, new: str, complaint: str) -> None:
    text = wrong(old, new)
    if old == "}, partial)":
        text = text.replace("os.replace(partial, checkpoint)", "pass")
    with pytest.raises(check.CheckFailed, match=complaint):
        namespace["test_train"](answer(namespace, text), folder=tmp_path / "run")
