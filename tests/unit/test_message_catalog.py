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

import polib
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
NOT_YET: dict[str, str] = {}
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


# -- Chinese punctuation in the package's Chinese messages ---------------------------------------
# A Chinese sentence takes full-width punctuation, with no space around it: 「崩溃（SIGSEGV）。」,
# 「原因：……」, and the dash 「——」. Code a message quotes (`...`), placeholders ({gap:.3g}) and paths
# keep their ASCII; what is judged is the punctuation that touches Chinese.
CATALOG = PACKAGE / "locale" / "zh_CN" / "LC_MESSAGES" / "fourcard_helpers.po"
HAN = "\u4e00-\u9fff"
CHINESE = f"{HAN}\u3000-\u303f\uff01-\uff60"  # Han characters and full-width punctuation
HALF_WIDTH = (
    f"[{CHINESE}] *[,;:!?]",  # 崩溃, 原因 / 原因: ...
    f"[,;:!?] *[{HAN}]",  # rank 0: 崩溃
    f"[{CHINESE}] *\\([^()]*\\)",  # 崩溃 (SIGSEGV)
    f"\\([^()]*[{HAN}][^()]*\\)",  # (第 05 课)
    "(?<!—)—(?!—)",  # a single dash, English's «cards — reason»
    f"[{CHINESE}] +- | - +[{CHINESE}]",  # a spaced hyphen standing in for the dash
)


def half_width_in_chinese(text: str) -> list[str]:
    """The half-width punctuation of `text` that stands in a Chinese sentence, outside code and placeholders."""
    text = re.sub(r"`[^`]*`|\{[^{}]*\}", "_", text)
    return [found.group(0) for pattern in HALF_WIDTH for found in re.finditer(pattern, text)]


def test_the_chinese_messages_use_chinese_punctuation() -> None:
    catalog = polib.pofile(str(CATALOG))
    wrong = [f"{entry.msgid[:60]!r}: {found!r}" for entry in catalog if entry.msgstr and not entry.obsolete
             for found in half_width_in_chinese(entry.msgstr)]
    assert not wrong, "write these with Chinese punctuation (，：；（）——):\n" + "\n".join(wrong)


@pytest.mark.parametrize("text", [
    "rank 1（共 4 个）在原生代码中崩溃 (SIGSEGV)。",
    "4 张模拟卡（CPU 进程，gloo） — 没有找到 GPU",
    "梯度不一致, 请检查钩子",
    "可能的原因: 缺少 set_epoch",
    "修正：用 DDP 包装模型 (第 05 课)。",
    "rank 0: 崩溃了",
])
def test_half_width_punctuation_in_a_chinese_sentence_is_found(text: str) -> None:
    assert half_width_in_chinese(text), text


@pytest.mark.parametrize("text", [
    "4 张模拟卡（CPU 进程，gloo）——没有找到 GPU",
    "修正：在 init_process_group(cards.backend) 之后写 model = DDP(model)（第 05 课）。",
    "请先用 `python -m fourcard_helpers.slurm down --dir ...` 停掉其中一个。",
    "finish() 之后梯度与单卡相差 {gap:.3g}：请检查 `if rank == 0: save()`。",
    "split 只能是 'train' 或 'test'，不能是 {split}",
    "{count} × {label} ({backend})",
])
def test_code_placeholders_and_chinese_punctuation_pass(text: str) -> None:
    assert half_width_in_chinese(text) == [], text
