"""The package's docstring maps its modules, the machinery that runs ranks apart from the lessons' own libraries:
a newcomer reads it first, so it must name every module, each once, and nothing that is not there."""
from __future__ import annotations

import re
from collections import Counter

import fourcard_helpers
from helpers import ROOT

PACKAGE = ROOT / "fourcard_helpers"
ENTRY = re.compile(r"^    (\w+(?:\.py|/)) ", re.MULTILINE)  # "    name.py   what it does" or "    name/   ..."


def test_the_package_docstring_maps_every_module_exactly_once() -> None:
    modules = {path.name for path in PACKAGE.glob("*.py") if path.name != "__init__.py"}
    modules |= {f"{path.parent.name}/" for path in PACKAGE.glob("*/__init__.py")}  # the subpackages, as folders
    entries = Counter(ENTRY.findall(fourcard_helpers.__doc__ or ""))
    assert [name for name, count in entries.items() if count > 1] == [], "named more than once in the map"
    assert sorted(modules - set(entries)) == [], "missing from the map in fourcard_helpers/__init__.py"
    assert sorted(set(entries) - modules) == [], "in the map, but no such module"
