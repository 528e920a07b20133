"""Write docs/solutions.md: every exercise of the course with its check and its solution.

The notebooks are the source: each exercise is a learner cell (a stub), a check cell and a
hidden `%%solution` cell. Instructors want them in one place; this gathers them, in course
order, so that the page can never drift from the notebooks (tests/unit/test_docs.py compares the
committed page with a fresh build).

    python docs/build_solutions.py        # rewrite docs/solutions.md
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "solutions.md"


def source(cell: dict) -> str:
    return "".join(cell["source"])


def exercises(path: Path) -> list[str]:
    """Markdown sections for one notebook's exercises: heading, check, solution."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    sections = []
    for index, cell in enumerate(cells):
        text = source(cell)
        if cell["cell_type"] != "code" or not text.startswith("%%solution"):
            continue
        body = text.partition("\n")[2].rstrip()
        named = re.findall(r"check\.exercise\(\s*f?[\"'](.+?)[\"']", body)  # the name the check prints
        title = named[-1] if named else f"cell {index}"
        sections.append(f"### {title}\n\n```python\n{body}\n```\n")
    return sections


def build() -> str:
    parts = ["# Exercise solutions, all lessons\n",
             "For instructors. Built from the notebooks' hidden `%%solution` cells by "
             "`python docs/build_solutions.py`; in a notebook, click a solution cell's margin to read it. "
             "Each solution ends with the same `check.exercise(...)` the learner runs, and "
             "running a notebook top to bottom proves that each solution passes its check.\n"]
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb")):
        title = source(json.loads(path.read_text(encoding="utf-8"))["cells"][0]).splitlines()[0].lstrip("# ")
        parts.append(f"## {title}\n\n`notebooks/{path.name}`\n")
        parts.extend(exercises(path))
    return "\n".join(parts)


if __name__ == "__main__":
    PAGE.write_text(build(), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}", file=sys.stderr)
