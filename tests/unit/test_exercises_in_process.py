"""The launch exercises' parts that need no launch: each says what it asks, the harness names a skipped collective,
finds an optimizer's state and tells a skeleton before any rank starts, and each lesson's hidden solution cell is the
package's reference solution."""
from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import torch

import fourcard_helpers.solutions as solutions
from fourcard_helpers import exercises
from fourcard_helpers.check import CheckFailed
from fourcard_helpers.exercises import harness
from fourcard_helpers.solutions import ddp
from helpers import NOTEBOOKS, cells, source


def test_every_exercise_says_what_it_asks() -> None:
    found = exercises.catalog()
    for name in ("overlapped-ddp", "bucketed-ddp", "sharded-optimizer", "hand-fsdp"):
        module = found[name]
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", module.NAME) and re.fullmatch(r"\d\d[b-z]?", module.LESSON)
        assert module.TITLE and "\n" not in module.TITLE
        assert all(hasattr(solutions, defined) for defined in module.DEFINES)


def test_a_skipped_collective_is_named_from_the_traces() -> None:
    call = {"kind": "launch", "op": "all_reduce", "numel": 36, "phase": "backward 1"}
    said = harness.skipped_collective({0: [call, call], 1: [call]})
    assert "rank(s) [1] never launched collective number 2" in said and "backward 1" in said
    assert harness.skipped_collective({0: [call], 1: [call]}) is None


def test_the_optimizer_state_is_found_where_a_wrapper_keeps_it() -> None:
    """Adam's exp_avg and exp_avg_sq count, its scalar step does not; an inner optimizer counts in a list or a
    dict as well as alone, and a storage shared by two views counts once."""
    from fourcard_helpers.exercises import _ranks

    weights = [torch.nn.Parameter(torch.ones(5)), torch.nn.Parameter(torch.ones(2, 3))]
    adam = torch.optim.Adam(weights)
    sum(w.sum() for w in weights).backward()
    adam.step()
    assert _ranks.optimizer_state_numbers(adam) == 2 * (5 + 6)

    class Holder(torch.optim.Optimizer):
        def __init__(self, inner: object) -> None:
            super().__init__([torch.nn.Parameter(torch.zeros(1))], {})
            self.inner = inner

    for kept in (adam, [adam], {"adam": adam}, ({"deep": adam},)):
        assert _ranks.optimizer_state_numbers(Holder(kept)) == 22, kept
    shared = torch.zeros(10)
    adam.state[weights[0]]["exp_avg"], adam.state[weights[0]]["exp_avg_sq"] = shared[:5], shared[5:]
    assert _ranks.optimizer_state_numbers(adam) == 10 + 12


def solution_cells() -> list[tuple[str, str]]:
    """(lesson, cell text) of every hidden solution cell that checks a build exercise."""
    return [(path.stem, source(cell)) for path in NOTEBOOKS for cell in cells(path)
            if cell["cell_type"] == "code" and source(cell).startswith("%%solution")
            and "exercises.solution_file()" in source(cell)]


def reference(name: str) -> object:
    """The definition called `name` in the reference solutions (any module of fourcard_helpers.solutions)."""
    import importlib
    import pkgutil
    modules = [importlib.import_module(f"fourcard_helpers.solutions.{info.name}")
               for info in pkgutil.iter_modules(solutions.__path__)]
    found = [getattr(module, name) for module in modules if name in vars(module)]
    assert found, f"{name} is in a lesson's solution cell but in no module of fourcard_helpers.solutions"
    return found[0]


def test_the_lessons_solution_cells_are_the_reference_solutions() -> None:
    """A build exercise's hidden solution is the package's reference, definition for definition: the tests
    compare the package's with PyTorch's own, the learner reads the cell's."""
    assert {lesson for lesson, _ in solution_cells()} >= {"05_ddp_with_torchrun", "09_memory_and_sharding"}
    for lesson, text in solution_cells():
        body = text.partition("\n")[2]
        for node in ast.parse(body).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                assert ast.get_source_segment(body, node) == inspect.getsource(reference(node.name)).rstrip("\n"), (
                    f"{lesson}: {node.name} differs from fourcard_helpers/solutions: copy one into the other")


def test_a_skeleton_is_not_attempted_without_a_launch(tmp_path: Path) -> None:
    """A skeleton is told from the reference, from a file that lacks the class, and from a learner's own
    NotImplementedError with a message, all before any rank starts."""
    header = "import contextlib\n\nimport torch\nimport torch.distributed as dist\nfrom torch import nn\n\n\n"
    overlapped = header + inspect.getsource(ddp._unused) + "\n\n" + inspect.getsource(ddp.OverlappedDDP)
    answer = tmp_path / "answer.py"

    def skeleton(text: str) -> None:
        answer.write_text(text, encoding="utf-8")
        harness.skeleton(answer, ("OverlappedDDP",))

    with pytest.raises(NotImplementedError, match="OverlappedDDP"):
        skeleton(header + "class OverlappedDDP(nn.Module):\n    def __init__(self, module):\n"
                          "        super().__init__()\n        raise NotImplementedError\n")
    with pytest.raises(CheckFailed, match="does not define OverlappedDDP"):
        skeleton(header)
    skeleton(overlapped)  # the reference is no skeleton
    mine = "        self.module = module\n"
    assert mine in overlapped
    skeleton(overlapped.replace(mine, mine + "        if not dist.is_initialized():\n"  # the learner's own error
                                "            raise NotImplementedError(\"one process: nothing to average\")\n"))
