"""Build exercises: the learner writes a mechanism in a file, and a check runs it on real ranks.

A build exercise asks for a piece of distributed training itself (DDP's overlapped all-reduce, buckets,
ZeRO, FSDP, ...), written in a file of the learner's. Its check launches the file's definitions on
four ranks with the course's launcher, compares what they compute with one card, measures the point
of the mechanism (overlap, message sizes, bytes held), and says "correct" or names the mistake from
the evidence. The same check runs from a notebook, from a terminal and in the tests:

    check.exercise("Exercise 1", lambda: exercises.run("overlapped-ddp", "my_ddp.py"))   # a notebook
    python -m fourcard_helpers.check overlapped-ddp my_ddp.py                            # a terminal
    python -m fourcard_helpers.check --list

HOW TO ADD ONE (one module in this folder; nothing to register):

1. `fourcard_helpers/exercises/my_thing.py` defines
       NAME = "my-thing"                  # the CLI name, kebab-case
       LESSON = "06"
       TITLE = N_("a one-line description")
       DEFINES = ("MyThing",)             # what the learner's file must define
       def check(path: Path, nproc: int = 4) -> str:
           harness.skeleton(path, DEFINES)                 # NotImplementedError while it is the skeleton
           result = harness.launch(__file__, path, nproc)  # runs this same file on the ranks (below)
           ...judge result.reports / result.traces; raise CheckFailed(sentence) naming the mistake...
           return "the verdict, with the figures that prove it"
       if __name__ == "__main__":         # what each rank runs
           learner, device, parameters = _ranks.start()   # group joined, learner's file imported
           _ranks.phase("step 1"); ... use learner.MyThing, compare with one card on this rank ...
           _ranks.finish(gap=..., ...)                     # reports, leaves the group, exits
   Import with absolute names (`from fourcard_helpers.exercises import harness`): the file also runs
   as a script. Messages to the learner go through `_()` (fourcard_helpers.language); docs/translate.py
   extracts them from this folder too, so each needs its Chinese in
   fourcard_helpers/locale/zh_CN/LC_MESSAGES/fourcard_helpers.po (`translate.py update`, under the
   translate lock), or tests/unit/test_chinese.py fails.
2. Put the reference solution in `fourcard_helpers/solutions/<family>.py` and re-export it in
   `solutions/__init__.py`.
3. Add a test to tests/process/test_exercises.py: the reference passes, the skeleton is "not attempted",
   and each mistake the check names is diagnosed (a small learner file each; nproc=2 where the
   diagnosis is the same).
4. In the lesson: prose (what to build, how it is checked), a `%%writefile my_thing.py` cell with
   the skeleton (a required definition whose body is `raise NotImplementedError`), the check cell,
   and a hidden `%%solution` cell: the reference's imports and definitions, copied verbatim from
   solutions/, then `check.exercise("Exercise N", lambda: exercises.run("my-thing", exercises.solution_file()))`.
   `solution_file()` writes the solution cell itself (its check line left out) to a file of its own,
   so the learner's file is never touched; tests/process/test_exercises.py keeps the cell equal to solutions/.

What every check gets from `harness` (kernel side) and `_ranks` (rank side): the skeleton found
without a launch; a rank's exception turned into the learner's traceback in a CheckFailed; a rank
that skipped a collective named (which rank, which collective, in which phase), within the
collectives' time limit (harness.COLLECTIVE_TIMEOUT), never a frozen cell; each rank's trace of its
collectives (`harness.launches(trace, phase)`), and `explain=` to read the traces of a failed launch
with the exercise's own eyes. `_ranks.TiedNet` is a small model with a tied layer, a frozen one and a
buffer; _ddp.py shows a whole family built on these pieces.
"""
from __future__ import annotations

import ast
import importlib
import pkgutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Sequence

from ..language import _

# How long a learner's sends, receives or collectives may wait before a check names the wait instead of waiting
# on (the ring, ring-attention, pipeline and expert-dispatch checks): a working answer takes milliseconds, so
# this bounds a wait that would never end; it measures nothing.
LIMIT_SECONDS = 10.0


def catalog() -> dict[str, ModuleType]:
    """Every build exercise by its NAME, in lesson order."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_") and info.name != "harness":
            module = importlib.import_module(f"{__name__}.{info.name}")
            found.append(module)
    return {module.NAME: module for module in sorted(found, key=lambda m: (m.LESSON, m.NAME))}


def run(name: str, path: str | Path, nproc: int = 4) -> str:
    """Check the learner's file `path` against exercise `name`; the verdict, or CheckFailed /
    NotImplementedError (not attempted yet)."""
    exercises = catalog()
    if name not in exercises:
        raise KeyError(_("no build exercise is called {name!r}; there are: {names}").format(
            name=name, names=", ".join(exercises)))
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(_("{path} does not exist: write your answer to that file first (in a notebook, "
                                  "run the %%writefile cell above)").format(path=path))
    return exercises[name].check(path, nproc)


_solution_folder: Path | None = None


def solution_file() -> Path:
    """The hidden `%%solution` cell that calls this (from its check line), written to a file of its own,
    the check line left out: what the learner's file would hold, had the learner written the reference.

    The cell's text comes from the lines IPython's `%%solution` registers for it (magic.py)."""
    global _solution_folder
    frame = sys._getframe(1)
    while frame is not None and not frame.f_code.co_filename.startswith("<solution-"):
        frame = frame.f_back
    if frame is None:
        raise RuntimeError(_("solution_file() is called from the check line of a %%solution cell"))
    import linecache
    text = "".join(linecache.getlines(frame.f_code.co_filename))
    tree = ast.parse(text)
    keep = [node for node in tree.body if not node.lineno <= frame.f_lineno <= (node.end_lineno or node.lineno)]
    if _solution_folder is None:
        _solution_folder = Path(tempfile.mkdtemp(prefix="fourcard-solutions-"))
    path = _solution_folder / f"{frame.f_code.co_filename.strip('<>')}.py"
    path.write_text("\n".join(ast.get_source_segment(text, node, padded=True) or "" for node in keep) + "\n",
                    encoding="utf-8")
    return path


def main(argv: Sequence[str]) -> int:
    """`python -m fourcard_helpers.check EXERCISE FILE.py [--nproc N]` (exit 0 correct, 1 wrong, 2 not attempted
    or usage) and `python -m fourcard_helpers.check --list`."""
    from ..check import CheckFailed

    words = list(argv)
    if words == ["--list"]:
        for name, module in catalog().items():
            print(f"{name}\t{_('lesson')} {module.LESSON}\t{_(module.TITLE)}\t{_('defines')}: {', '.join(module.DEFINES)}")
        return 0
    nproc = 4
    if len(words) == 4 and words[2] == "--nproc" and words[3].isdigit() and int(words[3]) > 1:
        nproc = int(words.pop())
        words.pop()
    if len(words) != 2:
        print(_("usage: python -m fourcard_helpers.check EXERCISE FILE.py [--nproc N]   (or --list for the "
                "exercises)"), file=sys.stderr)
        return 2
    name, path = words
    try:
        verdict = run(name, path, nproc)
    except CheckFailed as failure:
        print("✗ " + _("{name}: not yet. {failure}").format(name=name, failure=failure))
        return 1
    except NotImplementedError as skeleton:
        print("○ " + _("{name}: not attempted yet. {detail}").format(name=name, detail=skeleton))
        return 2
    except (KeyError, FileNotFoundError, ValueError) as usage:
        print(str(usage).strip("\"'"), file=sys.stderr)
        return 2
    print("✓ " + _("{name}: correct. {verdict}").format(name=name, verdict=verdict))
    return 0
