"""The course's conventions, checked on every notebook's source (nbval checks the outputs).

A learner relies on each of these: a title that says what they will be able to do, exercises
with a check and a hidden solution, launches whose output nbval does not compare (rank order
varies) and scripts that leave their process group cleanly (a rank that does not can abort
at exit under gloo).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def test_the_course_has_its_lessons_in_order() -> None:
    numbers = [int(path.name[:2]) for path in NOTEBOOKS]
    assert numbers == list(range(len(numbers))) and len(numbers) >= 2


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_title_summary_and_exercises(path: Path) -> None:
    markdown = [source(c) for c in cells(path) if c["cell_type"] == "markdown"]
    assert markdown and re.match(rf"# {path.name[:2]} · ", markdown[0]), "first cell: '# NN · Title'"
    assert "you will be able to" in markdown[0].lower()
    text = "\n".join(markdown)
    assert re.search(r"^## Summary", text, re.M) and re.search(r"^## Exercises", text, re.M)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_exercise_has_a_check_and_a_hidden_solution(path: Path) -> None:
    code = [c for c in cells(path) if c["cell_type"] == "code"]
    checks = [source(c) for c in code if "check.exercise(" in source(c) and not c["metadata"].get("jupyter", {}).get("source_hidden")]
    solutions = [c for c in code if source(c).startswith("# Solution") and c["metadata"].get("jupyter", {}).get("source_hidden")]
    assert checks, "no exercise check"
    assert len(solutions) >= len(checks) and all("check.exercise(" in source(c) for c in solutions)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_launch_cells_are_not_compared_and_leave_cleanly(path: Path) -> None:
    for cell in cells(path):
        text = source(cell)
        if cell["cell_type"] != "code" or not text.startswith("%%torchrun"):
            continue
        tags = cell["metadata"].get("tags", [])
        assert "nbval-ignore-output" in tags or "NBVAL_IGNORE_OUTPUT" in text, text[:80]
        if "init_process_group(" in text or "init_device_mesh(" in text:
            assert "destroy_process_group()" in text, f"script never leaves its group:\n{text[:200]}"
