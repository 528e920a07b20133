"""The fast tier: `pytest -m "not slow"` leaves out every notebook run (nbval's cells), as well as the
tests marked slow, so that a contributor gets an answer in about a minute; CI runs everything.

Tests marked `background` collect a run that starts as soon as collection ends and goes on beside the
rest of the suite (the lessons under another rounding, tests/test_other_rounding.py): they are ordered
last, so that waiting for those runs costs the suite as little time as possible.

A lesson that needs SLURM (its notebook's metadata says `"fourcards": {"needs": "slurm"}`) is left out where
SLURM is not installed, with the sentence that installs it; in CI (CI=true) it runs anyway and fails there,
since a skip would hide a missing install step."""
from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

import pytest

# The Chinese notebooks' code is the English with the text of its figures translated, and their stored
# outputs come from running them (docs/translate.py run; tests/test_chinese.py and
# tests/test_chinese_notebooks.py check both, cell by cell). nbval runs these Chinese lessons again, each
# in one rounding: 00 (the launcher's and the pre-flight check's messages) and 02 (a diagram, a widget
# and the exercises' verdicts). All seventeen would add about 15 minutes to CI, which keeps within 75.
CHINESE_NBVAL = ("00_cards_and_launching", "02_data_parallelism_by_hand")
collect_ignore = [str(path.relative_to(Path(__file__).parent))
                  for path in sorted(Path(__file__).parent.glob("notebooks/zh/*.ipynb")) if path.stem not in CHINESE_NBVAL]

# The English stored outputs are in English: the launcher's and the doctor's messages must be too,
# whatever the maintainer's locale (fourcard_helpers/language.py; tests that want Chinese set it
# themselves). A Chinese notebook chooses Chinese itself, which the setting would override: nbval's
# kernel for it starts without the setting (pytest_runtest_setup).
ENGLISH = "en"
os.environ["FOURCARDS_LANG"] = ENGLISH


@cache
def cannot_run_here(notebook: Path) -> str | None:
    """Why this lesson cannot run on this machine, or None when it can (always None in CI)."""
    needs = json.loads(Path(notebook).read_text(encoding="utf-8"))["metadata"].get("fourcards", {}).get("needs")
    if needs != "slurm" or os.environ.get("CI"):
        return None
    from fourcard_helpers.slurm import INSTALL_HINT, missing_programs

    return f"{Path(notebook).name} needs SLURM: {INSTALL_HINT}" if missing_programs() else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    """nbval starts a notebook's kernel in its first cell's setup: for a Chinese notebook, without
    the setting, which is back as soon as the kernel has started (the lessons that run beside it
    under another rounding start their own pytest with it)."""
    chinese = type(item).__name__ == "IPyNbCell" and Path(item.path).parent.name == "zh"
    if chinese:
        os.environ.pop("FOURCARDS_LANG", None)
    try:
        yield
    finally:
        os.environ["FOURCARDS_LANG"] = ENGLISH


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if type(item).__name__ == "IPyNbCell":  # a notebook cell that nbval runs: a whole lesson, top to bottom
            item.add_marker(pytest.mark.slow)
            if reason := cannot_run_here(item.path):
                item.add_marker(pytest.mark.skip(reason=reason))
    waiting = [item for item in items if item.get_closest_marker("background")]
    items[:] = [item for item in items if not item.get_closest_marker("background")] + waiting


def _background_modules(session: pytest.Session) -> dict[object, list[pytest.Item]]:
    modules: dict[object, list[pytest.Item]] = {}
    for item in session.items:
        if item.get_closest_marker("background"):
            modules.setdefault(item.module, []).append(item)
    return modules


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    for module, items in _background_modules(session).items():
        module.start_in_background([item.callspec.params["notebook"] for item in items])


def pytest_sessionfinish(session: pytest.Session) -> None:
    for module in _background_modules(session):
        module.stop_background()

