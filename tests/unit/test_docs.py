"""The instructors' pages stay true to the notebooks."""
from __future__ import annotations

import importlib.util
import json

from helpers import ROOT


def load_builder():
    spec = importlib.util.spec_from_file_location("build_solutions", ROOT / "docs" / "build_solutions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_solutions_page_is_built_from_the_current_notebooks() -> None:
    builder = load_builder()
    assert builder.PAGE.read_text(encoding="utf-8") == builder.build(), "run: python docs/build_solutions.py"


def test_solutions_page_has_every_solution() -> None:
    solutions = sum(
        1 for path in (ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb")
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]
        if "".join(cell["source"]).startswith("%%solution"))
    page = (ROOT / "docs" / "solutions.md").read_text(encoding="utf-8")
    assert page.count("```python") == solutions and solutions > 0
