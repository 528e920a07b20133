"""The Chinese edition (中文版): gettext catalogs of the English text, and what is built from them.

The English notebooks and documents are the source; the Chinese edition is built from them and
from one catalog per text (the `.po` format translators' tools read: Poedit, Weblate):

* a lesson `notebooks/NN_x.ipynb` has `docs/zh/lessons/NN_x.po`: one entry per markdown cell,
  keyed by the cell's id (msgctxt), its English source as msgid and the Chinese as msgstr.
  `notebooks/zh/NN_x.ipynb` is the English notebook with those cells in Chinese, and with the line
  `%fourcards_lang zh` under its first code cell's `%load_ext fourcard_helpers` (the package's
  messages in Chinese); its other code cells are the English ones, with the text its figures and
  widgets show in Chinese (code_messages: entries of the same catalog). Its stored outputs are
  its own: `run` executes it and keeps them while its code stays the same (tests/test_chinese.py
  and tests/test_chinese_notebooks.py check all of it; nbval runs two Chinese lessons again).
* `README.md` and `docs/instructor_guide.md` have `docs/zh/README.po` and
  `docs/zh/instructor_guide.po`, one entry per paragraph (code blocks are copied, not translated):
  `README.zh.md` and `docs/instructor_guide.zh.md` are built from them, with the same commands.

When an English cell or paragraph changes, `update` keeps its old translation and marks it
fuzzy (gettext's word for stale), with the old English beside it (#| msgid), so a translator
sees what changed; until someone translates it again, tests/test_chinese.py fails naming the
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
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import polib

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
# (tests/test_chinese_notebooks.py checks it). A literal is figure text where it stands:
TEXT_METHODS = {"set_title", "set_xlabel", "set_ylabel", "suptitle", "text", "annotate", "set_text"}  # any argument
LABEL_METHODS = {"set_xticks", "set_yticks", "legend"}  # the arguments after the first: the labels
TEXT_KEYWORDS = {"title", "xlabel", "ylabel", "label", "labels", "description", "text"}  # in any call
PLOTS_DATA = {"timeline", "card_values"}  # plots' helpers: the lanes, kinds and panels of their first argument
CODE = " code"  # msgctxt of a figure's literal: the cell's id, then this


def is_code_context(context: str | None) -> bool:
    return bool(context) and context.endswith(CODE)


def _parsed(source: str) -> ast.Module | None:
    """A code cell as Python, its IPython lines (%magic, !shell) blanked so that the lines keep their
    numbers; None for a cell magic's cell (%%torchrun runs in the ranks, which draw nothing) or one
    that is not Python."""
    if source.lstrip().startswith("%%"):
        return None
    try:
        return ast.parse("\n".join("" if line.lstrip().startswith(("%", "!")) else line
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


def figure_literals(tree: ast.Module, own: dict[str, list[str]]) -> list[ast.expr]:
    """The literals of a cell that a figure or widget shows (the rules above), in the cell's order;
    and those of a loop over written tuples (`for curve, label in [(..., "1 card"), ...]`) at the
    places whose name the loop only shows (`label=label`, and no `results[label]`)."""
    found, shown = [], []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        texts = [keyword.value for keyword in node.keywords if keyword.arg in TEXT_KEYWORDS]
        if name in TEXT_METHODS:
            texts += node.args
        elif name in LABEL_METHODS:
            texts += node.args[1:]
        elif name in PLOTS_DATA:
            texts += node.args[:1]
        elif name in own:
            texts += [arg for arg, parameter in zip(node.args, own[name]) if parameter in TEXT_KEYWORDS]
        shown += [text for text in texts if isinstance(text, ast.Name)]
        found += [literal for text in texts for literal in _literals_in(text)]
    for loop in (node for node in ast.walk(tree) if isinstance(node, ast.For) and isinstance(node.target, ast.Tuple)
                 and isinstance(node.iter, (ast.List, ast.Tuple))):
        used = [node for statement in loop.body for node in ast.walk(statement) if isinstance(node, ast.Name)]
        places = [n for n, target in enumerate(loop.target.elts) if isinstance(target, ast.Name)
                  and any(target.id == name.id for name in used)
                  and all(any(name is text for text in shown) for name in used if name.id == target.id)]
        for row in (row for row in loop.iter.elts if isinstance(row, ast.Tuple)):
            found += [literal for n in places if n < len(row.elts) for literal in _literals_in(row.elts[n])]
    words = [literal for literal in found if re.search(r"[A-Za-z]{2}", _constant_text(literal))]
    return sorted(words, key=lambda literal: (literal.lineno, literal.col_offset))


def _constant_text(literal: ast.expr) -> str:
    """What a literal says outside its placeholders."""
    if isinstance(literal, ast.JoinedStr):
        return " ".join(part.value for part in literal.values if isinstance(part, ast.Constant))
    return literal.value


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
    """The figure text of a lesson's code cells, one message per literal and cell."""
    notebook = read_notebook(lesson)
    own, messages = _text_parameters(notebook), []
    for index, cell in enumerate(notebook["cells"]):
        source = "".join(cell["source"])
        tree = _parsed(source) if cell["cell_type"] == "code" else None
        for literal in figure_literals(tree, own) if tree else ():
            start, end = _segment(source, literal)
            message = Message(cell["id"] + CODE, source[start:end], lesson.name, "code", index)
            if message not in messages:
                messages.append(message)
    return messages


def translated_code(source: str, chinese: dict[str, str]) -> str:
    """A code cell with each literal that `chinese` translates (English literal → Chinese literal)
    replaced, wherever it is text; never where it is data: a key looked up (`row["cards"]`), a
    dictionary's key or a value compared keep the English the rest of the lesson uses."""
    tree = _parsed(source)
    if tree is None or not chinese:
        return source
    literals: list[ast.expr] = []
    def collect(node: ast.AST) -> None:  # every literal that is text, an f-string whole
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
    for start, end in sorted((_segment(source, literal) for literal in literals), reverse=True):
        if source[start:end] in chinese:
            source = source[:start] + chinese[source[start:end]] + source[end:]
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
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            text = chinese.get((cell["id"], "".join(cell["source"])))
            if text is not None:
                cell["source"] = text.splitlines(True)
        elif cell["cell_type"] == "code":
            figures = {english: text for (context, english), text in chinese.items() if context == cell["id"] + CODE}
            source = chinese_code(translated_code("".join(cell["source"]), figures))
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
    run, which tests/test_chinese_notebooks.py reports as a notebook to run."""
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


def not_run() -> list[Path]:
    """The lessons whose Chinese notebook's outputs are not from a run of its current code."""
    return [lesson for lesson in lessons()
            if json.loads(built_lesson(lesson)).get("metadata", {}).get(RAN) is None]


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
    environment = {name: value for name, value in os.environ.items() if name != "FOURCARDS_LANG"}
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


def build() -> None:
    """Write every Chinese notebook and document, the links the notebooks need, and the package's .mo.

    It overwrites the Chinese lessons (a learner's edits in notebooks/zh/ are lost) and deletes
    nothing: the Chinese notebook of a lesson renamed or removed is deleted by hand, with its catalog."""
    link_shared_files()
    for lesson in lessons():
        _write(CHINESE_NOTEBOOKS / lesson.name, built_lesson(lesson))
    for name, (_, chinese) in DOCUMENTS.items():
        _write(ROOT / chinese, built_document(name))
    if PACKAGE_CATALOG.exists() and not compiled_is_current():
        _load(PACKAGE_CATALOG).save_as_mofile(str(PACKAGE_CATALOG.with_suffix(".mo")))


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


def not_built() -> list[str]:
    """The Chinese files that differ from what `build` writes now."""
    found = []
    for lesson in lessons():
        path = CHINESE_NOTEBOOKS / lesson.name
        if not path.exists() or path.read_text(encoding="utf-8") != built_lesson(lesson):
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


def update() -> None:
    """Merge the English into every catalog (new entries empty, changed ones fuzzy), then build."""
    for path, messages in catalogs():
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = merge(_load(path), messages)
        if not path.exists() or str(merged) != str(_load(path)):
            merged.save(str(path))
    build()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("update", "build", "check", "run"))
    parser.add_argument("lessons", nargs="*", help="run: the lessons to run (00, 12b, or the notebook's name); all without")
    arguments = parser.parse_args()
    command = arguments.command
    if command == "update":
        update()
    elif command == "build":
        build()
    elif command == "run":
        run(arguments.lessons)
    found = problems() + [f"{path}: differs from what `python docs/translate.py build` writes" for path in not_built()]
    found += [f"notebooks/zh/{lesson.name}: its outputs are not from a run of its code: "
              f"`python docs/translate.py run {lesson.stem.split('_')[0]}`" for lesson in not_run()]
    for line in found:
        print(line)
    print(f"{len(found)} to do" if found else "the Chinese edition is complete and built")
    if command == "check" and found:
        sys.exit(1)


if __name__ == "__main__":
    main()
