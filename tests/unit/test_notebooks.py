"""The course's conventions, checked on every notebook's source (nbval checks the outputs).

A learner relies on each of these: a title that says what they will be able to do; exercises
with a check and a hidden `%%solution` that "Run All" proves without overwriting the learner's
attempt, at least one of them asking for code; launches whose output nbval does not compare
(rank order varies), one idea each (short), saved as the script file the lesson ships, and
leaving their process group cleanly (a rank that does not can abort at exit under gloo).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from helpers import NOTEBOOKS, cells, source


def lesson_id(path: Path) -> str:
    """A lesson's number as its file name gives it: "07", or "12b" for a companion of lesson 12."""
    return path.name.split("_")[0]


def test_the_course_has_its_lessons_in_order() -> None:
    """Lessons 00, 01, ... with no gap; a companion lesson (12b) follows the lesson it goes with."""
    ids = [lesson_id(path) for path in NOTEBOOKS]
    numbered = [i for i in ids if i.isdigit()]
    assert numbered == [f"{n:02d}" for n in range(len(numbered))] and len(numbered) >= 2
    for k, i in enumerate(ids):
        if not i.isdigit():
            assert re.fullmatch(r"\d\d[b-z]", i) and ids[k - 1][:2] == i[:2], f"{i}: a companion follows its lesson"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_title_summary_and_exercises(path: Path) -> None:
    markdown = [source(c) for c in cells(path) if c["cell_type"] == "markdown"]
    assert markdown and re.match(rf"# {lesson_id(path)} · ", markdown[0]), "first cell: '# NN · Title'"
    assert "you will be able to" in markdown[0].lower()
    text = "\n".join(markdown)
    assert re.search(r"^## Summary", text, re.M) and re.search(r"^## Exercises", text, re.M)


MAX_LAUNCH_LINES = 85  # "one idea per launch": a script a learner reads in one screen or two, one statement a line
# (tests/unit/test_script_text.py); lesson 13's 2 × 2 mesh, tensor + sequence parallel under FSDP2, is the longest


def hidden(cell: dict) -> bool:
    return bool(cell["metadata"].get("jupyter", {}).get("source_hidden"))


def output_text(cell: dict) -> str:
    return "".join("".join(out.get("text", "")) for out in cell.get("outputs", []))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_exercise_has_a_check_and_a_hidden_solution(path: Path) -> None:
    code = [c for c in cells(path) if c["cell_type"] == "code"]
    checks = [c for c in code if "check.exercise(" in source(c) and not source(c).startswith("%%solution")]
    solutions = [c for c in code if source(c).startswith("%%solution")]
    assert checks, "no exercise check"
    assert all(hidden(c) for c in solutions), "a %%solution cell must have its source hidden"
    assert len(solutions) >= len(checks) and all("check.exercise(" in source(c) for c in solutions)
    assert not [c for c in code if source(c).startswith("# Solution")], "solutions run as %%solution cells"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_numbered_exercise_is_checked(path: Path) -> None:
    """An exercise the text sets must have its check: "Exercise N" in the prose, check.exercise("Exercise N...")
    in the code. An experiment without a check belongs under another name ("Going further")."""
    prose = "".join(source(c) for c in cells(path) if c["cell_type"] == "markdown")
    code = "".join(source(c) for c in cells(path) if c["cell_type"] == "code")
    set_in_prose = set(re.findall(r"\bExercise (\d+)\b", prose))   # capitalised: an exercise's heading
    checked = set(re.findall(r"check\.exercise\([\"']Exercise (\d+)", code))
    assert set_in_prose, "no numbered exercise"
    assert set_in_prose <= checked, f"exercises with no check: {sorted(set_in_prose - checked)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_run_all_leaves_the_learners_attempt_alone(path: Path) -> None:
    """The stored outputs come from Run All: every learner's check must still say 'not attempted' (or, for an
    exercise that asks for a launch, that no launch has succeeded yet)."""
    for cell in cells(path):
        text = source(cell)
        if cell["cell_type"] == "code" and "check.exercise(" in text and not text.startswith("%%solution"):
            shown = output_text(cell)
            assert "not attempted" in shown or "no successful launch yet" in shown, \
                f"a check ran a solution, not the learner's stub:\n{text[:200]}"
        if cell["cell_type"] == "code" and text.startswith("%%solution"):
            shown = [line for line in output_text(cell).splitlines() if line.strip()]
            assert shown and all(line.startswith("✓ ") and "reference solution passes" in line for line in shown), \
                f"a solution's stored output must be its verdict alone, no answer:\n{shown}"


def python_of(text: str) -> ast.Module:
    """A code cell's Python: its cell magic's line left out (the rest of a %%solution is Python), line
    magics turned into the calls IPython makes of them."""
    from IPython.core.inputtransformer2 import TransformerManager
    return ast.parse(TransformerManager().transform_cell(text.partition("\n")[2] if text.startswith("%%") else text))


def launching_functions(path: Path) -> set[str]:
    """The launching functions (below) that a notebook defines."""
    return launching_functions_of([source(cell) for cell in cells(path) if cell["cell_type"] == "code"])


def launching_functions_of(code: list[str]) -> set[str]:
    """Names of the functions the notebook defines that start ranks: their body calls torchrun, or submits a
    job with sbatch."""
    found = set()
    for text in code:
        if text.startswith("%%torchrun"):
            continue
        for node in ast.walk(python_of(text)):
            if isinstance(node, ast.FunctionDef) and ("torchrun(" in ast.unparse(node) or "'sbatch'" in ast.unparse(node)):
                found.add(node.name)
    return found


def is_real_code(solution: str, check_cell: str, launchers: set[str]) -> bool:
    """A loop (a for or while statement, or a comprehension), a class, or a launch of ranks: more than a
    formula in a def. A launch is a call of torchrun, or of a function of the notebook that calls it,
    in the solution or in the check that judges it."""
    nodes = list(ast.walk(python_of(solution)))
    if any(isinstance(node, (ast.For, ast.While, ast.comprehension, ast.ClassDef)) for node in nodes):
        return True
    calls = {getattr(node.func, "id", getattr(node.func, "attr", None))
             for text in (solution, check_cell) for node in ast.walk(python_of(text)) if isinstance(node, ast.Call)}
    return bool(calls & ({"torchrun"} | launchers))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_at_least_one_exercise_asks_for_real_code(path: Path) -> None:
    """An exercise that only fills in a formula teaches little: each lesson asks for a loop, a class or a
    launch at least once (its reference solution shows which)."""
    code = [source(c) for c in cells(path) if c["cell_type"] == "code"]
    launchers = launching_functions(path)
    real = []
    for k, text in enumerate(code):
        if text.startswith("%%solution"):
            name = re.search(r'check\.exercise\("([^"]+)"', text).group(1)
            check_cell = next(c for c in reversed(code[:k]) if f'check.exercise("{name}"' in c)
            if is_real_code(text, check_cell, launchers):
                real.append(name)
    assert real, "every exercise's solution is a formula: ask for a loop, a class or a launch in one of them"


def test_real_code_is_told_from_a_formula() -> None:
    formula = "%%solution\ndef f(n):\n    return n * (n + 1) / 2\ncheck.exercise('x', lambda: None)\n"
    assert not is_real_code(formula, "check.exercise('x', lambda: t(f))", set())
    assert is_real_code("%%solution\ndef f(xs):\n    for x in xs:\n        pass\n", "", set())
    assert is_real_code("%%solution\nclass S:\n    pass\n", "", set())
    assert is_real_code("%%solution\nr = torchrun(SCRIPT)\n", "", set())
    assert is_real_code(formula, "check.exercise('x', lambda: train_task(f))", {"train_task"})
    sbatch = "def submit(run):\n    return sh('sbatch', '--parsable', run)\n"
    assert launching_functions_of([sbatch]) == {"submit"} and launching_functions_of([formula]) == set()


def launches(path: Path) -> list[tuple[str, str]]:
    """(magic line, script body) of every %%torchrun cell."""
    found = []
    for cell in cells(path):
        text = source(cell)
        if cell["cell_type"] == "code" and text.startswith("%%torchrun"):
            line, _, body = text.partition("\n")
            found.append((line, body))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_launch_is_one_short_script_saved_as_the_file_the_course_ships(path: Path) -> None:
    for line, body in launches(path):
        saved = re.search(r"--save\s+(\S+)", line)
        assert saved, f"{line}: give every launch --save scripts/{lesson_id(path)}_what_it_does.py"
        assert re.fullmatch(rf"scripts/{lesson_id(path)}_[a-z0-9_]+\.py", saved.group(1)), saved.group(1)
        lines = body.rstrip("\n").count("\n") + 1
        assert lines <= MAX_LAUNCH_LINES, f"{saved.group(1)}: {lines} lines; split it into one idea per launch"
        shipped = path.parent / saved.group(1)
        assert shipped.is_file(), f"{shipped.name} is not committed"
        assert shipped.read_text(encoding="utf-8") == body, f"{shipped.name} differs from its cell: re-run the cell"


def test_every_shipped_script_comes_from_a_cell() -> None:
    saved = {(path.parent / re.search(r"--save\s+(\S+)", line).group(1)).resolve()
             for path in NOTEBOOKS for line, _ in launches(path) if "--save" in line}
    shipped = {p.resolve() for p in (NOTEBOOKS[0].parent / "scripts").glob("[0-9][0-9]_*.py")}
    assert shipped <= saved, f"stale scripts no cell saves: {sorted(p.name for p in shipped - saved)}"


DOCTOR_SAYS = "torchrun: doctor: "


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_doctor_speaks_exactly_where_a_lesson_stages_a_mistake(path: Path) -> None:
    """A launch cell tagged `doctor-warns` stages a classic mistake, and its stored output shows the
    doctor's warning; every other launch of the course gets none (a false alarm teaches the wrong thing)."""
    for cell in cells(path):
        if cell["cell_type"] == "code" and source(cell).startswith("%%torchrun"):
            warned = DOCTOR_SAYS in output_text(cell)
            staged = "doctor-warns" in cell["metadata"].get("tags", [])
            assert warned == staged, f"doctor {'warned' if warned else 'silent'}: {source(cell)[:120]}"


@pytest.mark.parametrize("number", ["01", "05b"])
def test_lessons_that_stage_data_parallel_mistakes_show_the_doctor(number: str) -> None:
    path = next(p for p in NOTEBOOKS if p.name.startswith(number))
    assert any("doctor-warns" in c["metadata"].get("tags", []) for c in cells(path))
