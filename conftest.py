"""The fast tier: `pytest -m "not slow"` leaves out every notebook run (nbval's cells), as well as the
tests marked slow, so that a contributor gets an answer in about a minute; CI runs everything.

Tests marked `background` collect a run that starts as soon as collection ends and goes on beside the
rest of the suite (the lessons under another rounding, tests/test_other_rounding.py): they are ordered
last, so that waiting for those runs costs the suite as little time as possible."""
from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if type(item).__name__ == "IPyNbCell":  # a notebook cell that nbval runs: a whole lesson, top to bottom
            item.add_marker(pytest.mark.slow)
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
