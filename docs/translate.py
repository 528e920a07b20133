"""The Chinese edition (中文版): gettext catalogs of the English text, and what is built from them.

The English notebooks and documents are the source; the Chinese edition is built from them and
from one catalog per text (the `.po` format translators' tools read: Poedit, Weblate):

* a lesson `notebooks/NN_x.ipynb` has `docs/zh/lessons/NN_x.po`: one entry per markdown cell,
  keyed by the cell's id (msgctxt), its English source as msgid and the Chinese as msgstr.
  `notebooks/zh/NN_x.ipynb` is the English notebook with those cells in Chinese, and with the line
  `%fourcards_lang zh` under its first code cell's `%load_ext fourcard_helpers` (the package's
  messages in Chinese); its other code cells are the English ones, with the text its figures and
  widgets show, and what its exercises' checks say is off, in Chinese (code_messages: entries of the
  same catalog). Its stored outputs are
  its own: `run` executes it and keeps them while its code stays the same (tests/unit/test_chinese.py
  and tests/lessons/test_chinese_notebooks.py check all of it; nbval runs two Chinese lessons again).
* `README.md` and `docs/instructor_guide.md` have `docs/zh/README.po` and
  `docs/zh/instructor_guide.po`, one entry per paragraph (code blocks are copied, not translated):
  `README.zh.md` and `docs/instructor_guide.zh.md` are built from them, with the same commands.

When an English cell or paragraph changes, `update` keeps its old translation and marks it
fuzzy (gettext's word for stale), with the old English beside it (#| msgid), so a translator
sees what changed; until someone translates it again, tests/unit/test_chinese.py fails naming the
lesson and cell. A fuzzy or untranslated entry is built in English. An entry no longer used is
kept as obsolete (#~), as msgmerge keeps it, and comes back if its English does.

    python docs/translate.py update   # merge the English into the catalogs, then build
    python docs/translate.py build    # only build the Chinese edition from the catalogs
    python docs/translate.py check    # what is stale or untranslated, not built or not run (exit 1)
    python docs/translate.py run 07   # run Chinese lessons (all without a name) and keep their outputs

The launcher's and the doctor's messages have a catalog of their own inside the package
(fourcard_helpers/locale/, see fourcard_helpers/language.py); `update` refreshes it too.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import polib

from fourcard_helpers.rundir import LANG_ENV

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CHINESE_NOTEBOOKS = NOTEBOOKS / "zh"
CATALOGS = ROOT / "docs" / "zh"
LESSON_CATALOGS = CATALOGS / "lessons"
DOCUMENTS = {  # English document → (its catalog, the Chinese document built from it)
    "README.md": ("docs/zh/README.po", "README.zh.md"),
    "docs/instructor_guide.md": ("docs/zh/instructor_guide.po", "docs/instructor_guide.zh.md"),
}
PACKAGE = ROOT / "fourcard_helpers"
PACKAGE_CATALOG = PACKAGE / "locale" / "zh_CN" / "LC_MESSAGES" / "fourcard_helpers.po"
# What the lessons' code reads or writes beside the notebook (scripts it saves and runs, measured
# records, the capstone's model files): a Chinese notebook finds them through these links, so
# that its code cells are the English ones, character for character.
SHARED_WITH_ENGLISH = ("scripts", "measured", "crash_once.py", "mnist_recipe.py", "my_model.py", "slow_epochs.py",
                       "my_ring.py", "my_tensor_parallel.py", "my_pipeline.py")  # the last: build exercises' files
SHARED_WITH_ENGLISH += ("my_ddp.py", "my_buckets.py", "my_zero.py", "my_fsdp.py")  # the learner's files of the build exercises of lessons 05 and 09
SHARED_WITH_ENGLISH += ("my_ring_attention.py", "my_expert_dispatch.py")  # lesson 14's build exercises
SHARED_WITH_ENGLISH += ("my_block_plan.py",)  # lesson 13's build exercise
SHARED_WITH_ENGLISH += ("my_clip.py",)  # lesson 10's build exercise
SHARED_WITH_ENGLISH += ("my_recipe.py",)  # lesson 13b's build exercise
HEADER = {
    "Project-Id-Version": "Four Cards",
    "Language": "zh_CN",
    "MIME-Version": "1.0",
    "Content-Type": "text/plain; charset=UTF-8",
    "Content-Transfer-Encoding": "8bit",
    "Plural-Forms": "nplurals=1; plural=0;",
}


def lessons() -> list[Path]:
    """The English lessons, in course order."""
    return sorted(NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb"))


def lesson_catalog(lesson: Path) -> Path:
    """Where the lesson's catalog lives: one per lesson, named as the notebook."""
    return LESSON_CATALOGS / f"{lesson.stem}.po"


def markdown_cells(notebook: dict) -> list[tuple[int, str, str]]:
    """(index, id, source) of each markdown cell with text."""
    return [(index, cell["id"], "".join(cell["source"])) for index, cell in enumerate(notebook["cells"])
            if cell["cell_type"] == "markdown" and "".join(cell["source"]).strip()]


def read_notebook(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def notebook_text(notebook: dict) -> str:
    """A notebook as nbformat writes it (so a built notebook diffs like a hand-saved one)."""
    return json.dumps(notebook, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


# -- catalogs --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Message:
    """One piece of English to translate: its key (a cell id; None for a paragraph or a package
    message, which are known by their text), its text and where it is (the file, and the cell or
    paragraph number: the catalog entry's location, `#: file:number`, and the name in errors)."""

    context: str | None
    text: str
    source: str
    unit: str = ""  # "cell", "code" (figure text in a code cell) or "paragraph"; empty for a package message
    number: int = 0

    @property
    def where(self) -> str:
        return f"{self.source} {self.unit} {self.number}" if self.unit else self.source


def _new_catalog() -> polib.POFile:
    catalog = polib.POFile(wrapwidth=0)  # msgids are whole cells: wrapping would only add noise to diffs
    catalog.metadata = dict(HEADER)
    return catalog


def _load(path: Path) -> polib.POFile:
    """The catalog at `path`, or an empty one where there is none yet."""
    return polib.pofile(str(path), wrapwidth=0) if path.exists() else _new_catalog()


def merge(old: polib.POFile, messages: list[Message]) -> polib.POFile:
    """gettext's msgmerge for this course: the catalog for `messages`, keeping what `old` knew.

    An entry whose key (cell id) is kept but whose English changed keeps its translation, marked
    fuzzy, with the English the translation was made from as previous_msgid (msgmerge --previous:
    through several edits, the first). Paragraphs have no key: a changed one is paired with the
    most similar old paragraph at its place among the unchanged ones, or is new. Entries no longer
    used are kept as obsolete, and found again by their English. A figure's text in a code cell
    (code_messages) is known by its cell and its literal together: a changed literal is a new entry.
    """
    current = {m.context for m in messages if m.context}
    by_context = {entry.msgctxt: entry for entry in old
                  if entry.msgctxt and not entry.obsolete and not is_code_context(entry.msgctxt)}
    by_text = {entry.msgid: entry for entry in old  # paragraphs, obsolete entries, cells re-created with a new id
               if (entry.obsolete or not entry.msgctxt or entry.msgctxt not in current)
               and not is_code_context(entry.msgctxt)}
    by_literal = {(entry.msgctxt, entry.msgid): entry for entry in old if is_code_context(entry.msgctxt)}
    replaced = _paired_paragraphs([entry for entry in old if not entry.msgctxt and not entry.obsolete],
                                  [m.text for m in messages if m.context is None])
    catalog = _new_catalog()
    catalog.metadata = dict(old.metadata) if old.metadata else dict(HEADER)
    seen: set[tuple[str | None, str]] = set()
    used: set[int] = set()
    for message in messages:
        if (message.context, message.text) in seen:
            continue
        seen.add((message.context, message.text))
        if message.unit == "code":  # a figure's literal: its own translation or none (a changed one is new)
            before = by_literal.get((message.context, message.text))
        else:
            before = by_context.get(message.context) if message.context else None
        if before is None and message.unit != "code":
            before = by_text.get(message.text)
        if before is None and message.context is None:
            before = replaced.get(message.text)
        entry = polib.POEntry(msgctxt=message.context, msgid=message.text,
                              occurrences=[(message.source, str(message.number) if message.unit else "")])
        if before is not None:
            used.add(id(before))
            entry.msgstr, entry.tcomment = before.msgstr, before.tcomment
            entry.flags = [flag for flag in before.flags if flag != "fuzzy"]
            made_from = before.previous_msgid if before.fuzzy and before.previous_msgid else before.msgid
            if before.msgstr and message.text != made_from:
                entry.flags.append("fuzzy")
                entry.previous_msgid = made_from
            elif before.fuzzy and not before.previous_msgid:  # marked stale by a translator: theirs to clear
                entry.flags.append("fuzzy")
        catalog.append(entry)
    for entry in old:
        if id(entry) not in used and entry.msgstr and (entry.msgctxt, entry.msgid) not in seen:
            entry.obsolete, entry.occurrences = True, []
            catalog.append(entry)
    return catalog


def _paired_paragraphs(old: list[polib.POEntry], texts: list[str]) -> dict[str, polib.POEntry]:
    """New paragraph text → the old entry it most likely replaced: within each run of paragraphs
    that difflib finds changed between two unchanged ones, the most similar (at least 60% alike)."""
    pairs: dict[str, polib.POEntry] = {}
    matcher = difflib.SequenceMatcher(None, [entry.msgid for entry in old], texts, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "replace":
            continue
        free = list(old[i1:i2])
        for text in texts[j1:j2]:
            scored = [(difflib.SequenceMatcher(None, entry.msgid, text).ratio(), n) for n, entry in enumerate(free)]
            if scored and max(scored)[0] >= 0.6:
                pairs[text] = free.pop(max(scored)[1])
    return pairs


def lesson_messages(lesson: Path) -> list[Message]:
    """What a lesson has to translate: its markdown cells, keyed by cell id, and its figures' text."""
    return [Message(cell_id, text, lesson.name, "cell", index)
            for index, cell_id, text in markdown_cells(read_notebook(lesson))] + code_messages(lesson)


# -- what figures and widgets show, written in code cells ------------------------------------
# A figure's title, axis labels, legend and text, and a widget's labels, are string literals in a
# lesson's code cells. Each is an entry of the lesson's catalog, keyed "<cell id> code" (msgctxt),
# with the literal as the code writes it (quotes, f prefix and {placeholders} included) as msgid
# and its Chinese, written as a literal too, as msgstr; a msgstr equal to the msgid keeps it as it
# is (a name of the code's own, a format). The Chinese lesson's code cell is the English one with
# each such literal replaced, wherever it occurs in that cell, and nothing else changed
# (tests/lessons/test_chinese_notebooks.py checks it). A literal is figure text where it stands:
TEXT_METHODS = {"set_title", "set_xlabel", "set_ylabel", "suptitle", "text", "annotate", "set_text"}  # any argument
LABEL_METHODS = {"set_xticks", "set_yticks", "legend"}  # the arguments after the first: the labels
TEXT_KEYWORDS = {"title", "xlabel", "ylabel", "label", "labels", "description", "text"}  # in any call
VERDICTS = ("✓", "✗", "○")  # a line printed with one of these marks (as check.py's verdicts are) is text too
# An exercise's check names what it compares (`check.equal(got, want, "ranks that reported")`, what=) and
# says what is off (`raise check.CheckFailed("...")`): the verdict ✗ the learner reads starts with it.
CHECK_DESCRIPTIONS = {"close": 2, "equal": 2, "CheckFailed": 0}  # check.py's function → the description's position
PLOTS_DATA = {"timeline", "card_values"}  # plots' helpers: the lanes, kinds and panels of their first argument
CODE = " code"  # msgctxt of a figure's literal: the cell's id, then this


def is_code_context(context: str | None) -> bool:
    return bool(context) and context.endswith(CODE)


MAGIC_VALUE = re.compile(r"^(\s*[\w\s,\[\]().]+?=\s*)%(?!%).*$")  # `before = %ranks pull before`


def _parsed(source: str) -> ast.Module | None:
    """A code cell as Python, its IPython lines (%magic, !shell) blanked and a magic's value
    (`x = %ranks pull x`) read as None, so that the lines keep their numbers and what stands before
    the magic its place; None for a cell magic's cell (%%torchrun runs in the ranks, which draw
    nothing) or one that is not Python."""
    if source.lstrip().startswith("%%"):
        return None
    try:
        return ast.parse("\n".join("" if line.lstrip().startswith(("%", "!")) else
                                   MAGIC_VALUE.sub(lambda found: found.group(1) + "None", line)
                                   for line in source.split("\n")))
    except SyntaxError:
        return None


def _literals_in(node: ast.AST) -> list[ast.expr]:
    """The string literals in an expression (an f-string whole), but not those a call inside it takes,
    a subscript looks up or a comparison compares: those are data, not text."""
    if isinstance(node, (ast.JoinedStr, ast.Constant)):
        return [node] if isinstance(node, ast.JoinedStr) or isinstance(node.value, str) else []
    if isinstance(node, (ast.Call, ast.Subscript, ast.Compare)):
        return []
    return [found for child in ast.iter_child_nodes(node) for found in _literals_in(child)]


def _text_parameters(notebook: dict) -> dict[str, list[str]]:
    """The lesson's own functions that draw (`def gantt(events, title, xlabel, ...)`): name → parameters,
    where a parameter named as a text keyword takes figure text."""
    found = {}
    for cell in notebook["cells"]:
        tree = _parsed("".join(cell["source"])) if cell["cell_type"] == "code" else None
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.FunctionDef):
                names = [a.arg for a in node.args.posonlyargs + node.args.args]
                if set(names) & TEXT_KEYWORDS:
                    found[node.name] = names
    return found


def _shown_arguments(node: ast.Call, own: dict[str, list[str]]) -> list[ast.expr]:
    """The arguments of a call that a figure or widget shows as text (the rules above)."""
    name = _call_name(node)
    texts = [keyword.value for keyword in node.keywords if keyword.arg in TEXT_KEYWORDS]
    if name in TEXT_METHODS:
        texts += node.args
    elif name in LABEL_METHODS:
        texts += node.args[1:]
    elif name in PLOTS_DATA:
        texts += node.args[:1]
    elif name in own:
        texts += [arg for arg, parameter in zip(node.args, own[name]) if parameter in TEXT_KEYWORDS]
    return texts


def check_descriptions(node: ast.Call) -> list[ast.expr]:
    """What a call of check.py's (`check.close`, `check.equal`, `check.CheckFailed`) is given to say in
    its verdict (CHECK_DESCRIPTIONS); nothing for any other call."""
    if not (isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "check" and node.func.attr in CHECK_DESCRIPTIONS):
        return []
    at = CHECK_DESCRIPTIONS[node.func.attr]
    return node.args[at:at + 1] + [keyword.value for keyword in node.keywords if keyword.arg == "what"]


def figure_literals(tree: ast.Module, own: dict[str, list[str]]) -> list[ast.expr]:
    """The literals of a cell that a figure or widget shows (the rules above), in the cell's order;
    and those of a loop over written tuples (`for curve, label in [(..., "1 card"), ...]`) at the
    places whose name the loop only shows (`label=label`, and no `results[label]`); and the
    descriptions an exercise's check gives (check_descriptions)."""
    found, shown = [], []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        described = [literal for text in check_descriptions(node) for literal in _literals_in(text)]
        found += described  # and the names it says (`f"...: {hint}"`): a name only said there is text too
        shown += [part.value for literal in described if isinstance(literal, ast.JoinedStr) for part in literal.values
                  if isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name)]
        texts = _shown_arguments(node, own)
        shown += [text for text in texts if isinstance(text, ast.Name)]
        if _call_name(node) == "print" and any(_constant_text(literal).startswith(VERDICTS)
                                               for literal in _literals_in(node.args[0]) if node.args):
            texts = list(node.args)  # a verdict the lesson prints: the learner reads it as the lesson's text
        found += [literal for text in texts for literal in _literals_in(text)]
    for assign in (node for node in ast.walk(tree) if isinstance(node, ast.Assign) and len(node.targets) == 1
                   and isinstance(node.targets[0], ast.Name)):  # `short = "saved" if ... else ...`, only shown
        uses = [node for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id == assign.targets[0].id
                and isinstance(node.ctx, ast.Load)]
        if uses and all(any(use is text for text in shown) for use in uses):
            found += _literals_in(assign.value)
    assigned = [node for node in ast.walk(tree) if isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)]
    bindings = Counter(node.targets[0].id for node in assigned)
    written = {node.targets[0].id: node.value for node in assigned  # `cases = ((...), ...)`, bound once
               if bindings[node.targets[0].id] == 1 and isinstance(node.value, (ast.List, ast.Tuple))}
    for loop in (node for node in ast.walk(tree) if isinstance(node, ast.For)):
        used = [node for statement in loop.body for node in ast.walk(statement) if isinstance(node, ast.Name)]
        for target, taken in _loop_rows(loop, written):
            if any(target.id == name.id for name in used) and all(
                    any(name is text for text in shown) for name in used if name.id == target.id):
                found += [literal for value in taken for literal in _literals_in(value)]
    words = [literal for literal in found if re.search(r"[A-Za-z]{2}", _constant_text(literal))]
    return sorted(words, key=lambda literal: (literal.lineno, literal.col_offset))


def _loop_rows(loop: ast.For, written: dict[str, ast.expr] | None = None) -> list[tuple[ast.Name, list[ast.expr]]]:
    """Each name a loop binds, with what it takes from the written tuples the loop goes over
    (`for a, b in [(..., ...), ...]`, `for ax, (title, x) in zip(axes, ((..., ...), ...))`, or a name
    the cell binds once to such tuples, `written`)."""
    pairs: list[tuple[ast.Name, list[ast.expr]]] = []
    def bind(target: ast.expr, rows: list[ast.expr]) -> None:
        if isinstance(target, ast.Name):
            pairs.append((target, rows))
        elif isinstance(target, ast.Tuple):
            for n, each in enumerate(target.elts):
                bind(each, [row.elts[n] for row in rows if isinstance(row, ast.Tuple) and len(row.elts) == len(target.elts)
                            and not any(isinstance(e, ast.Starred) for e in row.elts)])
    rows = (written or {}).get(loop.iter.id) if isinstance(loop.iter, ast.Name) else loop.iter
    if isinstance(rows, (ast.List, ast.Tuple)) and isinstance(loop.target, ast.Tuple):
        bind(loop.target, rows.elts)
    elif (isinstance(loop.iter, ast.Call) and _call_name(loop.iter) == "zip" and isinstance(loop.target, ast.Tuple)
          and len(loop.target.elts) == len(loop.iter.args)):
        for target, column in zip(loop.target.elts, loop.iter.args):
            if isinstance(column, (ast.List, ast.Tuple)):
                bind(target, column.elts)
    return pairs


def _constant_text(literal: ast.expr) -> str:
    """What a literal says outside its placeholders."""
    if isinstance(literal, ast.JoinedStr):
        return " ".join(part.value for part in literal.values if isinstance(part, ast.Constant))
    return literal.value


# -- what figures and widgets show, made from the lesson's data --------------------------------
# A legend, a tick or a lane is often not written where the figure is drawn: it is a loop variable
# (`for name, rate in rates.items(): ax.plot(..., label=name)`), a dictionary's key, a list built
# earlier. The literals such a name's value comes from are found by following the name back to where
# it is bound, in its cell or else in the latest earlier cell that binds it (shown_values). A plain
# literal found so is translated as a value, the same in every code cell of the lesson (msgctxt
# DATA): where it is also a dictionary's key and looked up, or compared (`kind == "waiting"`), the key,
# the lookup and the comparison change together, so the program does the same thing with another word.
# It is left English where the word may leave the notebook or come into it from outside: where it is
# written in a file the lesson reads or runs (a saved script, a measured record, the package) or in a
# %%torchrun cell, where the lesson looks for it inside other text (`"resumed" in line`,
# `.startswith("wait")`), or where it hands it to a call that is not a figure's or a container's (a
# path, a torch option, a job's name). Such a word is shown in Chinese where the lesson keeps the label
# apart from the key: a dictionary's value (`{"weights": "weights"}[kind]`, key → what the figure says)
# is translated in its own cell, where it is text, its keys kept; so is an f-string found so, as a
# figure's literal is.
DATA = "data" + CODE  # msgctxt of a value translated in every code cell of the lesson
DISPLAY_CALLS = TEXT_METHODS | LABEL_METHODS | PLOTS_DATA | {
    "plot", "bar", "barh", "scatter", "loglog", "semilogx", "semilogy", "errorbar", "step", "fill_between",
    "axhline", "axvline", "hist", "stackplot", "set", "interact", "Dropdown", "ToggleButtons", "RadioButtons",
    "SelectionSlider", "Select"}
SHOWN_KEYWORDS = TEXT_KEYWORDS | {"options", "xticklabels", "yticklabels"}  # widget choices: shown and passed on
CONTAINER_CALLS = {"list", "tuple", "sorted", "reversed", "set", "dict", "zip", "enumerate", "str", "len", "print",
                   "append", "extend", "insert", "index", "get", "setdefault", "items", "keys", "values", "join",
                   "format", "count", "remove", "pop", "update", "isinstance", "max", "min", "sum", "any", "all"}
READ_BESIDE = ("scripts", "measured", "*.py")  # what a lesson's code runs or reads, beside its notebook
PROBING_METHODS = {"startswith", "endswith", "split", "rsplit", "find", "rfind", "partition", "rpartition",
                   "replace", "removeprefix", "removesuffix", "count"}  # str methods that look inside a word


class _Bindings:
    """Where each name of a lesson's code is bound: per cell, name → [(kind, node, path)], kind
    "value" (`n = ...`, `n += ...`, `n.append(...)`), "item" (a loop's or comprehension's target: the
    items of `node` at `path`, an index per nested tuple), "part" (`a, b = pair`: the part of `node`
    at `path`) or "key" (`n[key] = ...`)."""

    def __init__(self, trees: list[ast.Module | None]) -> None:
        self.cells = [self._bound(tree) if tree else {} for tree in trees]

    @staticmethod
    def _bound(tree: ast.Module) -> dict[str, list[tuple[str, ast.expr, tuple[int, ...]]]]:
        found: dict[str, list[tuple[str, ast.expr, tuple[int, ...]]]] = {}
        def target(node: ast.expr, kind: str, value: ast.expr, path: tuple[int, ...]) -> None:
            if isinstance(node, ast.Name):
                found.setdefault(node.id, []).append((kind, value, path))
            elif isinstance(node, (ast.Tuple, ast.List)):
                for n, element in enumerate(node.elts):
                    if kind == "value" and isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(node.elts):
                        target(element, "value", value.elts[n], ())
                    else:
                        target(element, "item" if kind == "item" else "part", value, path + (n,))
            elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
                found.setdefault(node.value.id, []).append(("key", node.slice, ()))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for each in node.targets:
                    target(each, "value", node.value, ())
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                target(node.target, "value", node.value, ())
            elif isinstance(node, (ast.For, ast.comprehension)):
                target(node.target, "item", node.iter, ())
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
                  and isinstance(node.func.value, ast.Name) and node.func.attr in ("append", "extend", "insert")):
                found.setdefault(node.func.value.id, []).append(("value", node.args[-1], ()))
        return found

    def of(self, name: str, cell: int) -> list[tuple[str, ast.expr, tuple[int, ...], int]]:
        """The bindings of `name` that cell `cell` sees: its own, or the latest earlier cell's."""
        for index in range(cell, -1, -1):
            if name in self.cells[index]:
                return [(kind, node, path, index) for kind, node, path in self.cells[index][name]]
        return []


class _Tracer:
    """The string literals an expression's value can come from (shown_values)."""

    def __init__(self, bindings: _Bindings) -> None:
        self.bindings, self.seen, self.found = bindings, set(), []
        self.labels: set[int] = set()  # the literals found as a dictionary's values (`{key: "label"}`)

    def values(self, node: ast.expr, cell: int, path: tuple[int, ...] = ()) -> None:
        """The literals of `node`'s value; with a path, of the items of its value at that path."""
        key = (id(node), path)
        if key in self.seen:
            return
        self.seen.add(key)
        if path:
            return self.items(node, cell, path)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            self.found.append((cell, node))
        elif isinstance(node, ast.JoinedStr):
            self.found.append((cell, node))
            for part in node.values:
                if isinstance(part, ast.FormattedValue):
                    self.values(part.value, cell)
        elif isinstance(node, ast.Name):
            for kind, bound, at, where in self.bindings.of(node.id, cell):
                if kind == "value":
                    self.values(bound, where)
                elif kind == "key":
                    self.values(bound, where)
                elif kind == "item":  # a loop's target: (a part of) an item of what it loops over
                    self.items(bound, where, at)
                else:  # "part": a part of a value unpacked (`a, b = pair`)
                    self.part(bound, where, at)
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            for element in node.elts:
                self.values(element.value if isinstance(element, ast.Starred) else element, cell)
        elif isinstance(node, ast.Dict):
            for each in node.keys:
                if each is not None:
                    self.values(each, cell)
        elif isinstance(node, ast.IfExp):
            self.values(node.body, cell), self.values(node.orelse, cell)
        elif isinstance(node, ast.BinOp):
            self.values(node.left, cell), self.values(node.right, cell)
        elif isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
            self.values(node.elt, cell)
        elif isinstance(node, ast.Subscript):  # an element of a list, a value of a dictionary
            self.subscripted(node.value, cell)
        elif isinstance(node, ast.Call):
            name = _call_name(node)
            if name in ("list", "tuple", "sorted", "reversed", "set", "str") and node.args:
                self.values(node.args[0], cell)
            elif name == "keys" and isinstance(node.func, ast.Attribute):
                self.values(node.func.value, cell)

    def items(self, node: ast.expr, cell: int, path: tuple[int, ...]) -> None:
        """The literals of the items one gets looping over `node`, at `path` inside each item."""
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            for element in node.elts:
                self.part(element, cell, path)
        elif isinstance(node, ast.Dict):
            for each in node.keys:
                if each is not None:
                    self.part(each, cell, path)
        elif isinstance(node, (ast.ListComp, ast.GeneratorExp)):
            self.part(node.elt, cell, path)
        elif isinstance(node, ast.DictComp):  # its keys
            self.part(node.key, cell, path)
        elif isinstance(node, ast.Name):
            for kind, bound, at, where in self.bindings.of(node.id, cell):
                if kind == "value":
                    self.items(bound, where, path)
                elif kind == "key":  # a dictionary filled in a loop (`norms[name] = ...`): its keys
                    self.part(bound, where, path)
        elif isinstance(node, ast.BinOp):
            self.items(node.left, cell, path), self.items(node.right, cell, path)
        elif isinstance(node, ast.Call) and path:
            name, first, rest = _call_name(node), path[0], path[1:]
            if name == "zip" and first < len(node.args):
                self.items(node.args[first], cell, rest)
            elif name == "enumerate" and first == 1 and node.args:
                self.items(node.args[0], cell, rest)
            elif name == "items" and isinstance(node.func, ast.Attribute) and first == 0:
                self.items(node.func.value, cell, rest)  # the keys
            elif name == "items" and isinstance(node.func, ast.Attribute) and first == 1:
                self._dict_values(node.func.value, cell, rest)
            elif name == "values" and isinstance(node.func, ast.Attribute):
                self._dict_values(node.func.value, cell, path)
        elif isinstance(node, ast.Call):
            name = _call_name(node)
            if name in ("list", "tuple", "sorted", "reversed", "set") and node.args:
                self.items(node.args[0], cell, path)
            elif name == "keys" and isinstance(node.func, ast.Attribute):
                self.values(node.func.value, cell)
            elif name == "values" and isinstance(node.func, ast.Attribute):
                self._dict_values(node.func.value, cell)
        elif not path:
            self.values(node, cell)

    def subscripted(self, node: ast.expr, cell: int) -> None:
        """The literals of `node[...]`: a dictionary's values, a list's elements."""
        if isinstance(node, ast.Dict):
            self._dict_values(node, cell)
        elif isinstance(node, ast.Name):
            for kind, bound, _, where in self.bindings.of(node.id, cell):
                if kind == "value":
                    self.subscripted(bound, where)
        else:
            self.items(node, cell, ())

    def _dict_values(self, node: ast.expr, cell: int, path: tuple[int, ...] = ()) -> None:
        if isinstance(node, ast.Dict):
            for value in node.values:
                before, inside = len(self.found), {id(each) for each in ast.walk(value)}
                self.part(value, cell, path)
                self.labels |= {id(literal) for _, literal in self.found[before:] if id(literal) in inside}
        elif isinstance(node, ast.Name):
            for kind, bound, _, where in self.bindings.of(node.id, cell):
                if kind == "value":
                    self._dict_values(bound, where, path)

    def part(self, node: ast.expr, cell: int, path: tuple[int, ...]) -> None:
        """The literals at `path` inside one item (a written tuple: its element at each index)."""
        if not path:
            return self.values(node, cell)
        if isinstance(node, (ast.Tuple, ast.List)) and not any(isinstance(e, ast.Starred) for e in node.elts):
            if path[0] < len(node.elts):
                self.part(node.elts[path[0]], cell, path[1:])
        elif isinstance(node, (ast.Tuple, ast.List)) and len(path) == 1:  # (lane, *S[0], kind): before the star only
            stars = [n for n, e in enumerate(node.elts) if isinstance(e, ast.Starred)]
            if path[0] < stars[0]:
                self.values(node.elts[path[0]], cell)
        elif isinstance(node, ast.Name):
            for kind, bound, _, where in self.bindings.of(node.id, cell):
                if kind == "value":
                    self.part(bound, where, path)


def _call_name(node: ast.Call) -> str:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def _verdict_labels(node: ast.Call) -> list[ast.Subscript]:
    """The labels a printed verdict looks up in a dictionary (`print(f"✓ {BUILT[build]}: ...")`): the
    dictionary's values are what the line says, translated as a figure's labels are; other names in
    the verdict are data the lesson computed (a setup's key from a launch, a number) and stay as they are."""
    if not (_call_name(node) == "print" and node.args and any(
            _constant_text(literal).startswith(VERDICTS) for literal in _literals_in(node.args[0]))):
        return []
    return [part.value for literal in _literals_in(node.args[0]) if isinstance(literal, ast.JoinedStr)
            for part in literal.values if isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Subscript)
            and isinstance(part.value.value, ast.Name) and part.value.value.id.isupper()]


def _shown_names(node: ast.expr) -> list[ast.expr]:
    """The parts of a shown expression whose value the figure shows: names, and the calls that pass
    a value on (`list(kinds)`), followed through f-strings, conditionals and written lists."""
    if isinstance(node, (ast.Name, ast.Subscript)):
        return [node]
    if isinstance(node, ast.Call):
        return [node] if _call_name(node) in ("list", "tuple", "sorted", "reversed", "str", "keys") else []
    if isinstance(node, ast.JoinedStr):
        return [part.value for part in node.values if isinstance(part, ast.FormattedValue)
                for part in [part] if isinstance(part.value, (ast.Name, ast.Subscript))]
    if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
        return [node]
    if isinstance(node, (ast.List, ast.Tuple, ast.IfExp, ast.BinOp, ast.Starred)):
        return [found for child in ast.iter_child_nodes(node) for found in _shown_names(child)]
    return []


@functools.cache
def _read_beside() -> str:
    """What the lessons run or read beside their notebooks, and the package: a word in it is data."""
    files = [path for pattern in READ_BESIDE for path in NOTEBOOKS.glob(pattern)]
    files = [p for f in files for p in (sorted(f.rglob("*")) if f.is_dir() else [f]) if p.is_file()]
    files += sorted(PACKAGE.rglob("*.py"))
    return "\n".join(path.read_text(encoding="utf-8", errors="ignore") for path in files
                     if path.suffix in (".py", ".json", ".txt", ".sh", ".toml", ".csv", ""))


def shown_values(notebook: dict, own: dict[str, list[str]], beside: str) -> tuple[list[tuple[int, ast.expr]], set[str]]:
    """What figures and widgets show that the code does not write where it draws (above): the
    f-strings, by cell, and the plain values translated in every cell (DATA); and the lines the
    lesson prints with such a value in them, whose literals are text in their cell (a label in
    Chinese inside an English sentence would be half a translation)."""
    cells = notebook["cells"]
    sources = ["".join(cell["source"]) for cell in cells]
    trees = [_parsed(source) if cell["cell_type"] == "code" else None for cell, source in zip(cells, sources)]
    tracer = _Tracer(_Bindings(trees))
    for index, tree in enumerate(trees):
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.Call):
                for shown in _shown_arguments(node, own) + [k.value for k in node.keywords if k.arg in SHOWN_KEYWORDS]:
                    for part in _shown_names(shown):
                        tracer.values(part, index)
                    if any(k.value is shown and k.arg == "options" for k in node.keywords):
                        tracer.values(shown, index)
                for label in _verdict_labels(node):
                    tracer.values(label, index)
    magic = "\n".join(source for source, tree in zip(sources, trees) if tree is None)
    passed, probes = _passed_on(trees, own)
    values, strings = set(), []
    for index, literal in tracer.found:
        if isinstance(literal, ast.JoinedStr):
            strings.append((index, literal))
        elif not re.search(r"[A-Za-z]{2}", literal.value):
            continue
        elif (literal.value not in passed and not any(probe in literal.value for probe in probes)
              and not any(quote + literal.value + quote in text for quote in "\"'" for text in (beside, magic))):
            values.add(literal.value)
        elif id(literal) in tracer.labels:  # data elsewhere, but here the label a dictionary gives its key
            strings.append((index, literal))
    for index, tree in enumerate(trees):  # a line printed with such a value in it is read as text too: all of it
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                literals = [literal for arg in node.args for literal in _text_literals(arg)]  # a join's pieces too
                reach = _Tracer(tracer.bindings)
                for literal in literals:
                    for part in literal.values if isinstance(literal, ast.JoinedStr) else ():
                        if isinstance(part, ast.FormattedValue):
                            reach.values(part.value, index)
                if any(isinstance(found, ast.Constant) and found.value in values for _, found in reach.found):
                    strings += [(index, literal) for literal in literals
                                if re.search(r"[A-Za-z]{2}", _constant_text(literal))]
    return strings, values


def _passed_on(trees: list[ast.Module | None], own: dict[str, list[str]]) -> tuple[set[str], set[str]]:
    """The strings a lesson hands to a call that is neither a figure's nor a container's, nor one of
    the lesson's functions that only looks the argument up, compares or shows it: data; and
    the words it looks for inside others (`"offload" in strategy`, `.endswith("offload")`), which a
    value containing them is to keep."""
    lookups = {node.name: _looked_up_parameters(node) for tree in trees for node in (ast.walk(tree) if tree else ())
               if isinstance(node, ast.FunctionDef)}
    passed, probes = set(), set()
    for tree in trees:
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.Compare):  # `kind == "waiting"` is renamed with its value; `"x" in line` looks inside
                if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
                    probes.add(node.left.value)  # `"offload" in strategy`: a part of a word, looked for
            if isinstance(node, ast.Call) and _call_name(node) in PROBING_METHODS:
                probes |= {arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)}
            if not isinstance(node, ast.Call) or _call_name(node) in DISPLAY_CALLS | CONTAINER_CALLS | set(own):
                continue
            inside = lookups.get(_call_name(node) if isinstance(node.func, ast.Name) else "", set())
            passed |= {arg.value for n, arg in enumerate(node.args) if n not in inside
                       and isinstance(arg, ast.Constant) and isinstance(arg.value, str)}
            passed |= {k.value.value for k in node.keywords if k.arg not in SHOWN_KEYWORDS | inside
                       and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)}
    return passed, {probe for probe in probes if re.search(r"[A-Za-z]{2}", probe)}


def _looked_up_parameters(function: ast.FunctionDef) -> set[int | str]:
    """The parameters (by position and name) a function of the lesson only looks up, compares or
    shows: a string it is given there stays inside the lesson."""
    parents = {child: node for node in ast.walk(function) for child in ast.iter_child_nodes(node)}
    def stays(node: ast.AST) -> bool:
        parent = parents.get(node)
        while isinstance(parent, (ast.Tuple, ast.List)):
            node, parent = parent, parents.get(parent)
        if isinstance(parent, ast.Subscript):
            return node is parent.slice
        if isinstance(parent, ast.keyword):
            parent = parents.get(parent)
        return isinstance(parent, (ast.Compare, ast.FormattedValue)) or (
            isinstance(parent, ast.Call) and _call_name(parent) in DISPLAY_CALLS | CONTAINER_CALLS and node is not parent.func)
    names = [a.arg for a in function.args.posonlyargs + function.args.args]
    inside: set[int | str] = set()
    for n, name in enumerate(names):
        uses = [node for node in ast.walk(function) if isinstance(node, ast.Name) and node.id == name]
        if uses and all(stays(use) for use in uses):
            inside |= {n, name}
    return inside


def _segment(source: str, node: ast.expr) -> tuple[int, int]:
    """Where a node's source is in the cell's text, as character offsets (ast counts UTF-8 bytes)."""
    lines = source.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    def offset(line: int, byte: int) -> int:
        return starts[line - 1] + len(lines[line - 1].encode("utf-8")[:byte].decode("utf-8"))
    return offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset)


def code_messages(lesson: Path) -> list[Message]:
    """The figure text of a lesson's code cells, one message per literal and cell; a value shown
    from the lesson's data, one message for every cell (DATA); and the name a widget shows where it
    has no description (widget_names)."""
    notebook = read_notebook(lesson)
    own, messages = _text_parameters(notebook), []
    strings, values = shown_values(notebook, own, _read_beside())
    first: dict[str, int] = {}
    for index, cell in enumerate(notebook["cells"]):
        source = "".join(cell["source"])
        tree = _parsed(source) if cell["cell_type"] == "code" else None
        if tree is None:
            continue
        for node in _plain_strings(tree):
            first.setdefault(node.value, index)
        literals = figure_literals(tree, own) + [literal for where, literal in strings if where == index]
        shown = {_segment(source, literal) for literal in literals}
        elsewhere = {source[start:end] for start, end in map(lambda literal: _segment(source, literal), _text_literals(tree))
                     if (start, end) not in shown}  # the same literal as data in this cell: left as it is
        texts = [source[slice(*_segment(source, literal))] for literal in sorted(
            literals, key=lambda literal: (literal.lineno, literal.col_offset))
            if not (isinstance(literal, ast.Constant) and literal.value in values)]
        texts = [text for text in texts if text not in elsewhere]
        texts += [json.dumps(name, ensure_ascii=False) for name, _ in widget_names(tree)]
        for text in texts:
            message = Message(cell["id"] + CODE, text, lesson.name, "code", index)
            if message not in messages:
                messages.append(message)
    return messages + [Message(DATA, json.dumps(value, ensure_ascii=False), lesson.name, "code", first[value])
                       for value in sorted(values, key=lambda value: (first[value], value))]


WIDGET = re.compile(r"(Slider|Dropdown|Checkbox|ToggleButtons|RadioButtons|Select|Text)$")


def widget_names(tree: ast.Module) -> list[tuple[str, ast.Call]]:
    """interact()'s widgets that have no description: they show their parameter's name, which the
    Chinese lesson gives them as a description, translated (the one change beyond literals)."""
    return [(keyword.arg, keyword.value) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and _call_name(node) in ("interact", "interactive", "interact_manual")
            for keyword in node.keywords if keyword.arg and isinstance(keyword.value, ast.Call)
            and WIDGET.search(_call_name(keyword.value))
            and not any(each.arg == "description" for each in keyword.value.keywords)]


def _plain_strings(tree: ast.Module) -> list[ast.Constant]:
    """The string constants of a cell that are values of their own (not the pieces of an f-string)."""
    pieces = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    return [node for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in pieces]


def _text_literals(tree: ast.AST) -> list[ast.expr]:
    """Every literal of a cell that may be text, an f-string whole: not a key looked up, a
    dictionary's key or a value compared."""
    literals: list[ast.expr] = []
    def collect(node: ast.AST) -> None:
        if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            literals.append(node)
        elif isinstance(node, ast.Subscript):
            collect(node.value)
        elif isinstance(node, ast.Dict):
            for value in node.values:
                collect(value)
        elif not isinstance(node, ast.Compare):
            for child in ast.iter_child_nodes(node):
                collect(child)
    collect(tree)
    return literals


def _quoted(text: str, like: str) -> str:
    """`text` as a literal written with the quotes of the literal `like` (inside an f-string's
    placeholder, before Python 3.12, only the other quote may stand)."""
    opening = like.lstrip("rRuU")
    quote = opening[:1]
    if quote not in ("'", '"') or opening[:3] == quote * 3:
        return json.dumps(text, ensure_ascii=False)
    return quote + text.replace("\\", "\\\\").replace(quote, "\\" + quote).replace("\n", "\\n") + quote


def translated_code(source: str, chinese: dict[str, str], values: dict[str, str] | None = None) -> str:
    """A code cell with each literal that `chinese` translates (English literal → Chinese literal)
    replaced, wherever it is text; never where it is data: a key looked up (`row["cards"]`), a
    dictionary's key or a value compared keep the English the rest of the lesson uses. A value of
    `values` (English value → Chinese literal) is replaced everywhere, as the whole lesson does
    (DATA); a widget without a description is given its parameter's name, translated."""
    tree = _parsed(source)
    if tree is None or not (chinese or values):
        return source
    edits: dict[tuple[int, int], str] = {}
    for node in _plain_strings(tree):
        if values and node.value in values:
            start, end = _segment(source, node)
            edits[start, end] = _quoted(ast.literal_eval(values[node.value]), source[start:end])
    for literal in _text_literals(tree):
        start, end = _segment(source, literal)
        if (start, end) not in edits and source[start:end] in chinese:
            edits[start, end] = chinese[source[start:end]]
    for name, widget in widget_names(tree):
        text = chinese.get(json.dumps(name, ensure_ascii=False))
        if text is not None and text != json.dumps(name, ensure_ascii=False):
            last = (widget.args + [keyword.value for keyword in widget.keywords])[-1:]
            at = _segment(source, last[0])[1] if last else _segment(source, widget)[1] - 1
            edits[at, at] = (", " if last else "") + f"description={text}"
    for (start, end), text in sorted(edits.items(), reverse=True):
        source = source[:start] + text + source[end:]
    return source


def document_blocks(text: str) -> list[tuple[bool, str]]:
    """A markdown document as (translatable?, block) pairs: paragraphs, lists, tables and headings
    are translated; fenced code blocks are kept as they are."""
    blocks: list[tuple[bool, str]] = []
    lines, current, fence = text.splitlines(), [], None
    for line in lines:
        if fence is None and re.match(r"\s*(```|~~~)", line):
            if current:
                blocks.append((True, "\n".join(current)))
            current, fence = [line], re.match(r"\s*(```|~~~)", line).group(1)
        elif fence is not None:
            current.append(line)
            if line.strip().startswith(fence):
                blocks.append((False, "\n".join(current)))
                current, fence = [], None
        elif not line.strip():
            if current:
                blocks.append((True, "\n".join(current)))
            current = []
        else:
            current.append(line)
    if current:
        blocks.append((fence is None, "\n".join(current)))
    return blocks


def document_messages(name: str) -> list[Message]:
    """What a document has to translate: its paragraphs, lists, tables and headings, in order."""
    text = (ROOT / name).read_text(encoding="utf-8")
    return [Message(None, block, name, "paragraph", number)
            for number, (translate, block) in enumerate(document_blocks(text), start=1) if translate]


def package_messages() -> list[Message]:
    """Every message the package marks for translation: the string literals in _() and N_() calls
    (a message is one literal, formatted after translation, so that the catalog can hold it)."""
    messages = []
    for path in sorted(PACKAGE.rglob("*.py")):  # the subpackages too (exercises/: the build exercises' verdicts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("_", "N_")
                    and node.args):
                text = _literal(node.args[0])
                if text is not None:
                    messages.append(Message(None, text, str(path.relative_to(ROOT))))
                elif not isinstance(node.args[0], (ast.Name, ast.Subscript, ast.Attribute)):
                    raise SystemExit(f"{path.relative_to(ROOT)}:{node.lineno}: {node.func.id}() needs one string "
                                     "literal, formatted after translation with .format(...): a message built "
                                     "before it (an f-string, %, a call) cannot be in the catalog")
                # a name or subscript: _(CARDS_FIX), a constant whose text N_() marked where it is defined
    return messages + exercise_titles()


EXERCISE_CALL = re.compile(r"""check\.exercise\(\s*("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')""")


def exercise_titles() -> list[Message]:
    """The title each lesson gives `check.exercise(...)`: the verdict starts with it, and
    check.exercise() translates it, so that a Chinese verdict names its exercise in Chinese."""
    titles = []
    for lesson in lessons():
        for cell in read_notebook(lesson)["cells"]:
            if cell["cell_type"] == "code":
                for literal in EXERCISE_CALL.findall("".join(cell["source"])):
                    title = ast.literal_eval(literal)
                    if all(title != known.text for known in titles):
                        titles.append(Message(None, title, str(lesson.relative_to(ROOT))))
    return titles


def _literal(node: ast.expr) -> str | None:
    """The text of a string literal, or of literals joined with + (None for anything else)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # "..." + "..." across lines
        left, right = _literal(node.left), _literal(node.right)
        return left + right if left is not None and right is not None else None
    return None


def catalogs() -> list[tuple[Path, list[Message]]]:
    """Every catalog of the Chinese edition, with the English it must hold now."""
    found = [(lesson_catalog(lesson), lesson_messages(lesson)) for lesson in lessons()]
    found += [(ROOT / catalog, document_messages(name)) for name, (catalog, _) in DOCUMENTS.items()]
    found.append((PACKAGE_CATALOG, package_messages()))
    return found


def translated(catalog: polib.POFile) -> dict[tuple[str | None, str], str]:
    """(key, English) → Chinese, for the entries that are translated and not stale."""
    return {(entry.msgctxt, entry.msgid): entry.msgstr for entry in catalog
            if entry.msgstr and not entry.fuzzy and not entry.obsolete}


def problems(these: list[tuple[Path, list[Message]]] | None = None) -> list[str]:
    """Every English text whose Chinese is missing or stale, by lesson (or document) and cell
    (in `these` catalogs with their English; by default all of them)."""
    found = []
    for path, messages in catalogs() if these is None else these:
        done = translated(_load(path))
        stale = {(e.msgctxt, e.msgid) for e in merge(_load(path), messages) if e.fuzzy}
        for message in messages:
            key = (message.context, message.text)
            if key in done:
                continue
            what = "stale (its English changed since it was translated)" if key in stale else "not translated"
            first_line = message.text.strip().splitlines()[0][:70]
            found.append(f"{path.name}: {message.where}: {what}: {first_line!r}")
    return found


# -- what is built -----------------------------------------------------------------------------
LOAD_EXTENSION = "%load_ext fourcard_helpers\n"
# Under the first code cell's `%load_ext fourcard_helpers`, a Chinese lesson chooses Chinese for the
# package's messages: a line the learner sees, with how to switch (fourcard_helpers/language.py).
SPEAK_CHINESE = ("# 课程包的提示和练习判定用中文；改成 %fourcards_lang en 即为英文（设置了 FOURCARDS_LANG 时以它为准）\n"
                 "%fourcards_lang zh\n")


def chinese_code(source: str) -> str:
    """A code cell of the Chinese lesson: the English one, with Chinese chosen under the extension's load."""
    if not source.startswith(LOAD_EXTENSION):
        return source
    return LOAD_EXTENSION + SPEAK_CHINESE + source[len(LOAD_EXTENSION):]


RAN = "ran_from_code"  # the Chinese notebook's metadata: the digest of the code its stored outputs came from


def chinese_lesson(lesson: Path) -> dict:
    """The Chinese lesson before it runs: its markdown cells from the catalog, its figures' text too
    (translated_code), its first code cell choosing Chinese (chinese_code); the English outputs."""
    notebook = read_notebook(lesson)
    chinese = translated(_load(lesson_catalog(lesson)))
    values = {ast.literal_eval(english): text for (context, english), text in chinese.items() if context == DATA}
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            text = chinese.get((cell["id"], "".join(cell["source"])))
            if text is not None:
                cell["source"] = text.splitlines(True)
        elif cell["cell_type"] == "code":
            figures = {english: text for (context, english), text in chinese.items() if context == cell["id"] + CODE}
            source = chinese_code(translated_code("".join(cell["source"]), figures, values))
            if source != "".join(cell["source"]):
                cell["source"] = source.splitlines(True)
    notebook["metadata"]["language"] = "zh-CN"  # read by tests; the lesson's other metadata is kept
    return notebook


def code_digest(notebook: dict) -> str:
    """What a run's outputs depend on in the notebook: its code cells, in order."""
    code = [(cell.get("id"), "".join(cell["source"])) for cell in notebook["cells"] if cell["cell_type"] == "code"]
    return hashlib.sha256(json.dumps(code, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def built_lesson(lesson: Path) -> str:
    """The Chinese notebook for `lesson` (chinese_lesson), with the outputs of its own last run
    (`run`) where that run was of the same code, and the English outputs where it was not yet
    run, which tests/lessons/test_chinese_notebooks.py reports as a notebook to run."""
    notebook = chinese_lesson(lesson)
    path = CHINESE_NOTEBOOKS / lesson.name
    ran = read_notebook(path) if path.exists() else None
    if ran is not None and ran["metadata"].get(RAN) == code_digest(notebook):
        outputs = {cell["id"]: cell for cell in ran["cells"] if cell["cell_type"] == "code"}
        for cell in notebook["cells"]:
            if cell["cell_type"] == "code":
                cell["outputs"] = outputs[cell["id"]]["outputs"]
                cell["execution_count"] = outputs[cell["id"]]["execution_count"]
        notebook["metadata"][RAN] = code_digest(notebook)
    return notebook_text(notebook)


def built_lessons() -> dict[Path, str]:
    """Every lesson's Chinese notebook as `build` writes it now (built_lesson), each built once."""
    return {lesson: built_lesson(lesson) for lesson in lessons()}


def not_run(built: dict[Path, str] | None = None) -> list[Path]:
    """The lessons whose Chinese notebook's outputs are not from a run of its current code
    (`built`: the lessons as built_lessons() gives them, where the caller has them already)."""
    built = built_lessons() if built is None else built
    return [lesson for lesson, text in built.items() if json.loads(text).get("metadata", {}).get(RAN) is None]


MISSING_GLYPH = "missing from font"  # matplotlib's warning for a character its fonts cannot draw


def run(names: list[str]) -> None:
    """Run Chinese lessons top to bottom in a fresh kernel, as a learner's Run All does, and keep
    their outputs: what the Chinese learner sees (the package's messages, the figures, in Chinese).
    The kernel is started as nbval starts it, in notebooks/zh/, without FOURCARDS_LANG: the
    notebook's own `%fourcards_lang zh` decides."""
    chosen = [lesson for lesson in lessons() if not names or lesson.stem in names or lesson.stem.split("_")[0] in names]
    unknown = set(names) - {name for lesson in chosen for name in (lesson.stem, lesson.stem.split("_")[0])}
    if unknown:
        raise SystemExit(f"no lesson called {', '.join(sorted(unknown))}")
    link_shared_files()
    environment = {name: value for name, value in os.environ.items() if name != LANG_ENV}
    for lesson in chosen:
        path, notebook = CHINESE_NOTEBOOKS / lesson.name, chinese_lesson(lesson)
        before = path.read_text(encoding="utf-8") if path.exists() else None
        for cell in notebook["cells"]:  # an error stops the run: no output of an earlier run is left
            if cell["cell_type"] == "code":
                cell["outputs"], cell["execution_count"] = [], None
        path.write_text(notebook_text(notebook), encoding="utf-8")
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "notebook", "--execute", "--inplace",
                               "--ExecutePreprocessor.timeout=900", path.name], cwd=CHINESE_NOTEBOOKS, env=environment)
        seconds = time.monotonic() - started
        ran = read_notebook(path)
        missing = [index for index, cell in enumerate(ran["cells"]) if cell["cell_type"] == "code"
                   and any(MISSING_GLYPH in "".join(output.get("text", "")) for output in cell["outputs"])]
        if done.returncode != 0 or missing:
            # back to the state before the run, an earlier run's outputs included
            path.write_text(before, encoding="utf-8") if before is not None else _write(path, built_lesson(lesson))
            raise SystemExit(f"{path.relative_to(ROOT)}: " + (
                f"a glyph is missing from the fonts in cells {missing} (the Chinese font comes with the course: "
                "reinstall it with pip install -e . , which brings noto-cjk-sans-otc and matplotlib 3.11 or newer)"
                if missing else "the run failed"))
        ran["metadata"][RAN] = code_digest(notebook)
        path.write_text(notebook_text(ran), encoding="utf-8")
        _write(path, built_lesson(lesson))
        print(f"{path.relative_to(ROOT)}: ran in {seconds:.0f} s")


def built_document(name: str) -> str:
    """The Chinese document for `name`: its paragraphs from the catalog, its code blocks as they are."""
    catalog_path, _ = DOCUMENTS[name]
    chinese = translated(_load(ROOT / catalog_path))
    text = (ROOT / name).read_text(encoding="utf-8")
    blocks = [chinese.get((None, block), block) if translate else block for translate, block in document_blocks(text)]
    return "\n\n".join(blocks) + "\n"


def build() -> dict[Path, str]:
    """Write every Chinese notebook and document, the links the notebooks need, and the package's .mo;
    return the notebooks written (built_lessons), for the checks that follow.

    It overwrites the Chinese lessons (a learner's edits in notebooks/zh/ are lost) and deletes
    nothing: the Chinese notebook of a lesson renamed or removed is deleted by hand, with its catalog."""
    link_shared_files()
    built = built_lessons()
    for lesson, text in built.items():
        _write(CHINESE_NOTEBOOKS / lesson.name, text)
    for name, (_, chinese) in DOCUMENTS.items():
        _write(ROOT / chinese, built_document(name))
    if PACKAGE_CATALOG.exists() and not compiled_is_current():
        _load(PACKAGE_CATALOG).save_as_mofile(str(PACKAGE_CATALOG.with_suffix(".mo")))
    return built


def link_shared_files() -> None:
    """notebooks/zh/'s links to what the lessons' code opens beside the notebook (SHARED_WITH_ENGLISH)."""
    CHINESE_NOTEBOOKS.mkdir(exist_ok=True)
    for name in SHARED_WITH_ENGLISH:
        link = CHINESE_NOTEBOOKS / name
        if not link.is_symlink():
            link.symlink_to(Path("..") / name)


def _write(path: Path, text: str) -> None:
    """Write `text` only where it differs, so that an unchanged file keeps its time stamp."""
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def not_built(built: dict[Path, str] | None = None) -> list[str]:
    """The Chinese files that differ from what `build` writes now (`built`: as in not_run)."""
    found = []
    for lesson, text in (built_lessons() if built is None else built).items():
        path = CHINESE_NOTEBOOKS / lesson.name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            found.append(str(path.relative_to(ROOT)))
    for name, (_, chinese) in DOCUMENTS.items():
        if not (ROOT / chinese).exists() or (ROOT / chinese).read_text(encoding="utf-8") != built_document(name):
            found.append(chinese)
    if PACKAGE_CATALOG.exists() and not compiled_is_current():
        found.append(str(PACKAGE_CATALOG.with_suffix(".mo").relative_to(ROOT)))
    return found


def compiled_is_current() -> bool:
    """Whether the package's .mo, which gettext reads, holds exactly the .po's current translations.
    Compared as gettext reads it, not byte for byte: Poedit's msgfmt and polib lay it out differently."""
    compiled = PACKAGE_CATALOG.with_suffix(".mo")
    if not compiled.exists():
        return False
    holds = {entry.msgid: entry.msgstr for entry in polib.mofile(str(compiled)) if entry.msgid}  # "": the header
    return holds == {msgid: msgstr for (_, msgid), msgstr in translated(_load(PACKAGE_CATALOG)).items()}


def update(these: list[tuple[Path, list[Message]]] | None = None) -> dict[Path, str]:
    """Merge the English into every catalog (new entries empty, changed ones fuzzy), then build
    (`these`: the catalogs with their English, where the caller has them already)."""
    for path, messages in catalogs() if these is None else these:
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = merge(_load(path), messages)
        if not path.exists() or str(merged) != str(_load(path)):
            merged.save(str(path))
    return build()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("update", "build", "check", "run"))
    parser.add_argument("lessons", nargs="*", help="run: the lessons to run (00, 12b, or the notebook's name); all without")
    arguments = parser.parse_args()
    command = arguments.command
    these = catalogs()  # each lesson's English read once, each Chinese lesson built once
    if command == "update":
        built = update(these)
    elif command == "build":
        built = build()
    else:
        if command == "run":
            run(arguments.lessons)
        built = built_lessons()
    found = problems(these) + [f"{path}: differs from what `python docs/translate.py build` writes"
                               for path in not_built(built)]
    found += [f"notebooks/zh/{lesson.name}: its outputs are not from a run of its code: "
              f"`python docs/translate.py run {lesson.stem.split('_')[0]}`" for lesson in not_run(built)]
    for line in found:
        print(line)
    print(f"{len(found)} to do" if found else "the Chinese edition is complete and built")
    if command == "check" and found:
        sys.exit(1)


if __name__ == "__main__":
    main()
