"""Every message the package shows a learner goes through its catalog (fourcard_helpers/language.py).

A message written as a bare string reaches a Chinese learner in English, whatever the notebook
chose. This scan reads the package's source (no import, no process) and finds prose outside `_()`
and `N_()`: any f-string with words in it (the package builds its messages so), and any string with
words in the places a learner reads it: what is raised, printed or warned, what the pre-flight check
says (Findings.ok/warn/fail/say), what describe(), explain() and __repr__ return, and what is kept
in a name for a message (message, reason, hint, title, ...). Plain strings elsewhere are mostly
patterns matched against what torch or a rank printed (diagnose.py), which must stay English.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from helpers import ROOT

PACKAGE = ROOT / "fourcard_helpers"

SHOWN_BY_CALLS = {"print", "warn", "write", "ok", "fail", "say"}  # print(), warnings.warn(), stream.write(), Findings
RETURNS_SHOWN = {"describe", "explain", "__repr__", "__str__"}
MESSAGE_NAMES = re.compile(r"^(message|reason|hint|fix|cause|said|detail|why|verdict|text|title)s?$", re.I)

# Modules whose messages another piece of work routes through the catalog, each with the reason it
# is not scanned yet; remove a module from here once its messages are in the catalog.
NOT_SCANNED = {"solutions": "reference solutions: the learner's own code, as docs/solutions.md shows it",
               "schedules.py": "lesson 07's own functions, which its code cells define and tests/lessons/test_lesson_copies.py "
                               "keeps equal: code the learner reads, English in both editions"}
NOT_YET = {
    "costmodel.py": "the cost model's argument errors, with its own owner",
}
# Prose that is not a message to the learner (module, how it starts), each with why.
ALLOWED = {
    ("__init__.py", "module 'fourcard_helpers' has no attribute "): "Python's own AttributeError wording, "
    "which tools (hasattr, IPython's completer) expect in English",
    ("rundir.py", "unknown record kind "): "a bug in the package, never a learner's doing",
    ("reporting.py", "report from rank "): "report()'s line where no launcher collects the values: lesson 12b reads "
    "it in a SLURM job's log, in either language",
    ("preflight.py", "\nimport os"): "the script the pre-flight check launches: code, not prose",
    ("exercises/sharded_clip.py", "file  c"): "names of the check's phases (`file 0 case 1`), keys the traces are read by",
}


def _is_prose(text: str) -> bool:
    """Words a person reads: two or more words apart (a name such as `weight_gap`, a path or a regex is not)."""
    return sum(bool(re.fullmatch(r"[(\[\"'`]*[A-Za-z][a-z]*[)\]\"'`.,:;!?]*", word)) for word in text.split()) >= 2


def unwrapped_messages(source: str, module: str, allowed: dict | None = None) -> list[tuple[int, str]]:
    """(line, text) of each piece of prose in a place a learner reads it, outside _() and N_()."""
    tree = ast.parse(source)
    wrapped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("_", "N_"):
            wrapped |= {id(inner) for inner in ast.walk(node)}
    shown: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            shown.append(node.exc)
        elif isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name in SHOWN_BY_CALLS:
                shown += node.args
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in RETURNS_SHOWN:
            shown += [inner.value for inner in ast.walk(node) if isinstance(inner, ast.Return) and inner.value]
        elif isinstance(node, ast.Assign) and any(isinstance(target, ast.Name) and MESSAGE_NAMES.match(target.id)
                                                  for target in node.targets):
            shown.append(node.value)
    in_shown = {id(node) for root in shown for node in ast.walk(root)}
    parts = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    found = []
    for node in ast.walk(tree):
        if id(node) in wrapped or id(node) in parts:  # an f-string is judged whole
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) in in_shown:
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(part.value for part in node.values if isinstance(part, ast.Constant))
        else:
            continue
        if _is_prose(text) and not any(module == where and text.startswith(start)
                                       for where, start in (ALLOWED if allowed is None else allowed)):
            found.append((node.lineno, text))
    return sorted(set(found))


def scanned_modules() -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py"))
            if path.name not in NOT_YET and not NOT_SCANNED.keys() & set(path.relative_to(PACKAGE).parts)]


def test_every_message_of_the_package_goes_through_the_catalog() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {text[:70]!r}" for path in scanned_modules()
             for line, text in unwrapped_messages(path.read_text(encoding="utf-8"), path.relative_to(PACKAGE).as_posix())]
    assert not found, ("messages a learner reads that bypass the catalog; write them `_(\"... {name} ...\")"
                       ".format(name=...)` (from .language import _), then `python docs/translate.py update` "
                       "and translate them:\n" + "\n".join(found))


def test_the_exceptions_are_still_needed_and_few() -> None:
    assert all((PACKAGE / name).exists() for name in [*NOT_YET, *NOT_SCANNED])
    assert len(ALLOWED) <= 5
    for module, start in ALLOWED:
        flagged = unwrapped_messages((PACKAGE / module).read_text(encoding="utf-8"), module, allowed={})
        assert any(text.startswith(start) for _line, text in flagged), f"{module}: {start!r} is gone: drop it from ALLOWED"


@pytest.mark.parametrize("source", [
    'raise ValueError(f"nproc must be at least 1, got {n}")',
    'print("torchrun: interrupted; all ranks stopped")',
    'warnings.warn("this rank never joined the group")',
    'found.fail("cannot open a port", "allow local connections")',
    'def describe(self):\n    return f"{self.count} simulated cards"',
    'message = "the ranks disagree on the loss"\nraise CheckFailed(message)',
    'raise CheckFailed(_("a wrong sum: {x}").format(x=repr("not " + "wrapped here")))',
    'described = "; ".join(f"rank {rank}: {op} of {n} elements" for rank in ranks)',  # an f-string anywhere
    'TITLE = "A ring all-reduce from send/recv"',
])
def test_the_scan_finds_a_message_outside_the_catalog(source: str) -> None:
    assert unwrapped_messages(source, "example.py"), source


@pytest.mark.parametrize("source", [
    'raise ValueError(_("nproc must be at least 1, got {n}").format(n=n))',
    'print(_("torchrun: {nproc} ranks finished").format(nproc=4))',
    'print(f"[rank{rank}] {line}")',  # no words: a prefix and what a rank printed
    'FIX = N_("set the epoch")\nfound.fail(_(FIX))',
    'raise KeyError(name)',
    'if re.search("out of memory|OutOfMemoryError", text): pass',  # a pattern for what torch printed
    'TITLE = N_("A ring all-reduce from send/recv")',
])
def test_the_scan_passes_messages_in_the_catalog_and_what_is_not_prose(source: str) -> None:
    assert unwrapped_messages(source, "example.py") == [], source
