"""The whole suite's settings: the tests are in three tiers (pyproject.toml's testpaths), and nbval runs
every notebook. `pytest tests/unit` runs the tier that starts no process, the one to run after every
change; `pytest -m "not slow"` leaves out every notebook run (nbval's cells, marked slow here), as well
as the tests marked slow, in every tier; CI runs everything.

A lesson that needs SLURM (its notebook's metadata says `"fourcards": {"needs": "slurm"}`) is left out where
SLURM is not installed, with the sentence that installs it; in CI (CI=true) it runs anyway and fails there,
since a skip would hide a missing install step."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from fourcard_helpers.rundir import LANG_ENV  # standard library only: pytest's start-up loads no torch
from helpers import CHINESE_NBVAL, cannot_run_here  # tests/helpers.py (pyproject.toml puts tests/ on the path)

pytest_plugins = ["pytester"]  # tests/unit/test_unit_tier.py runs its conftest on tests of its own

# nbval runs the Chinese lessons named in CHINESE_NBVAL again (tests/helpers.py says why those two)
collect_ignore = [str(path.relative_to(Path(__file__).parent))
                  for path in sorted(Path(__file__).parent.glob("notebooks/zh/*.ipynb")) if path.stem not in CHINESE_NBVAL]

# The English stored outputs are in English: the launcher's and the doctor's messages must be too,
# whatever the maintainer's locale (fourcard_helpers/language.py; tests that want Chinese set it
# themselves). A Chinese notebook chooses Chinese itself, which the setting would override: nbval's
# kernel for it starts without the setting (pytest_runtest_setup).
ENGLISH = "en"
os.environ[LANG_ENV] = ENGLISH


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    """nbval starts a notebook's kernel in its first cell's setup: for a Chinese notebook, without
    the setting, which is back as soon as the kernel has started (the lessons that run beside it
    under another rounding start their own pytest with it). Every other test keeps the setting as
    it finds it: a test or a fixture that changes it does so with monkeypatch, which puts it back."""
    chinese = type(item).__name__ == "IPyNbCell" and Path(item.path).parent.name == "zh"
    if not chinese:
        yield
        return
    os.environ.pop(LANG_ENV, None)
    try:
        yield
    finally:
        os.environ[LANG_ENV] = ENGLISH


# What mostly waits, or leaves a core idle, runs first in the process tier, while the lessons' runs under another
# rounding, started in the background (tests/lessons/conftest.py), keep the cores busy; at the end of the suite,
# after those runs had ended, it waited on idle cores. Lessons 12 and 12b wait on stuck ranks' timeouts, on jobs
# that sleep by design and on SLURM's timers; the practice cluster's tests on SLURM's too.
WAITS_MOST = ("notebooks/12_beyond_one_machine.ipynb", "notebooks/12b_a_slurm_job.ipynb", "tests/process/test_slurm.py")


def waits_most(item: pytest.Item) -> bool:
    return item.nodeid.startswith(WAITS_MOST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if any(item.nodeid.startswith("tests/process/") for item in items):
        waiting = [item for item in items if waits_most(item)]
        rest = [item for item in items if not waits_most(item)]
        first = next((index for index, item in enumerate(rest) if item.nodeid.startswith("tests/process/")), len(rest))
        items[:] = rest[:first] + waiting + rest[first:]
    for item in items:
        if type(item).__name__ == "IPyNbCell":  # a notebook cell that nbval runs: a whole lesson, top to bottom
            item.add_marker(pytest.mark.slow)
            if reason := cannot_run_here(item.path):
                item.add_marker(pytest.mark.skip(reason=reason))

