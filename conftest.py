"""The fast tier: `pytest -m "not slow"` leaves out every notebook run (nbval's cells), as well as the
tests marked slow, so that a contributor gets an answer in about a minute; CI runs everything."""
from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if type(item).__name__ == "IPyNbCell":  # a notebook cell that nbval runs: a whole lesson, top to bottom
            item.add_marker(pytest.mark.slow)
