"""The Chinese edition says one thing one way: the renderings docs/zh/glossary.md chooses by meaning.

The glossary's TOML block names, for each meaning, the chosen Chinese, the renderings no longer
used, the English given once per lesson, and where 内存 (host RAM) is right; GPU memory is 显存.
Every lesson catalog, the two documents' catalogs and the package's messages are read here, as
text: no process, no notebook.
"""
from __future__ import annotations

import re
import sys
import tomllib
from functools import cache
from pathlib import Path

import polib
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))

import translate  # noqa: E402

GLOSSARY = ROOT / "docs" / "zh" / "glossary.md"
LESSON_CATALOGS = [translate.lesson_catalog(lesson) for lesson in translate.lessons()]
CATALOGS = LESSON_CATALOGS + [ROOT / catalog for catalog, _ in translate.DOCUMENTS.values()] + [translate.PACKAGE_CATALOG]
CJK = "\u3000-\u303f\u4e00-\u9fff\uff01-\uff60“”‘’…—"
HAN = "\u4e00-\u9fff"


@cache
def rules() -> dict:
    block = re.search(r"```toml\n(.*?)```", GLOSSARY.read_text(encoding="utf-8"), flags=re.S)
    assert block, "docs/zh/glossary.md has no ```toml block of renderings by meaning"
    return tomllib.loads(block.group(1))


def prose(text: str) -> str:
    """Text without code (fenced or inline), LaTeX and URLs: what a reader reads as Chinese."""
    text = re.sub(r"(```|~~~).*?\1", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\$\$.*?\$\$|\$[^$\n]+\$", " ", text, flags=re.S)
    return re.sub(r"https?://\S+", " ", text)


@cache
def entries(catalog: Path) -> list[polib.POEntry]:
    """The translated entries, in the order a reader meets them (cell or paragraph number)."""
    def place(entry: polib.POEntry) -> int:
        try:
            return int(entry.occurrences[0][1])
        except (IndexError, ValueError):
            return 0
    return sorted((entry for entry in polib.pofile(str(catalog)) if entry.msgstr and not entry.obsolete), key=place)


def where(catalog: Path, entry: polib.POEntry) -> str:
    return f"{catalog.name} {' '.join(entry.occurrences[0]) if entry.occurrences else entry.msgid[:40]!r}"


def test_the_glossary_block_is_read() -> None:
    chosen = {term["use"] for term in rules()["term"]}
    assert {"显存", "kernel", "数字图像", "对照", "全归约", "批大小", "轮", "激活值", "卡住", "notebook"} <= chosen
    assert len(rules()["memory_contexts"]) >= 4 and all(context["why"] for context in rules()["memory_contexts"])


@pytest.mark.parametrize("catalog", CATALOGS, ids=[path.stem for path in CATALOGS])
def test_each_meaning_has_its_one_rendering(catalog: Path) -> None:
    wrong = []
    for entry in entries(catalog):
        chinese, english = prose(entry.msgstr), re.sub(r"\s+", " ", prose(entry.msgid))
        for term in rules()["term"]:
            wrong += [f"{where(catalog, entry)}: {found.group(0)!r} ({term['meaning']}: the glossary says {term['use']!r})"
                      for pattern in term.get("reject", []) for found in re.finditer(pattern, chinese)]
            if "english" in term and re.search(term["english"], english, flags=re.I) and not any(
                    use in entry.msgstr for use in [term["use"], *term.get("also", [])]):
                wrong.append(f"{where(catalog, entry)}: the English says {term['meaning']!r}, the Chinese has no {term['use']!r}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("catalog", CATALOGS, ids=[path.stem for path in CATALOGS])
def test_memory_is_host_ram_only_where_the_glossary_allows_it(catalog: Path) -> None:
    """内存 is host RAM or memory in general, in the contexts the glossary lists with their reason;
    anywhere else the text speaks of a card's memory, which is 显存."""
    allowed = "|".join(f"(?:{context['pattern']})" for context in rules()["memory_contexts"])
    wrong = [f"{where(catalog, entry)}: …{rest[max(0, found.start() - 15):found.end() + 10]}… (GPU memory is 显存; "
             "or add the context, with its reason, to the glossary's memory_contexts)"
             for entry in entries(catalog)
             for rest in [re.sub(allowed, "", prose(entry.msgstr))]
             for found in re.finditer("内存", rest)]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("catalog", LESSON_CATALOGS, ids=[path.stem for path in LESSON_CATALOGS])
def test_the_english_is_given_once_where_a_lesson_first_uses_a_term(catalog: Path) -> None:
    wrong = []
    live = entries(catalog)  # a stale entry too: its Chinese is what the translator revises
    for term in (term for term in rules()["term"] if "english_once" in term):
        if term.get("first_use_by") == "english":
            first = next((entry for entry in live if re.search(term["english"], prose(entry.msgid), flags=re.I)), None)
        else:
            first = next((entry for entry in live if term["use"] in prose(entry.msgstr)), None)
        if first is not None and term["english_once"] not in prose(first.msgstr):
            wrong.append(f"{where(catalog, first)}: the lesson's first {term['use']!r} comes without "
                         f"'（{term['english_once']}）'")
    assert not wrong, "\n".join(wrong)


MARKDOWN_CATALOGS = CATALOGS[:-1]  # the package's messages are printed as they are: a line break there is one


@pytest.mark.parametrize("catalog", MARKDOWN_CATALOGS, ids=[path.stem for path in MARKDOWN_CATALOGS])
def test_no_line_break_between_two_chinese_characters(catalog: Path) -> None:
    """Markdown turns a line break inside a paragraph into a space: between two Chinese
    characters it shows as a stray gap. A heading or a table row ends its line on purpose."""
    wrong = []
    for entry in entries(catalog):
        text = re.sub(r"(```|~~~).*?\1", "", entry.msgstr, flags=re.S)
        for line, following in zip(text.split("\n"), text.split("\n")[1:]):
            if (line and following and re.match(f"[{CJK}]", line[-1]) and re.match(f"[{CJK}]", following[0])
                    and not line.lstrip().startswith(("#", "|"))):
                wrong.append(f"{where(catalog, entry)}: …{line[-12:]}⏎{following[:12]}…")
    assert not wrong, "\n".join(wrong)


def test_the_package_messages_use_full_width_punctuation_in_chinese() -> None:
    wrong = []
    for entry in entries(translate.PACKAGE_CATALOG):
        text = re.sub(r"`[^`]*`", " ", entry.msgstr)
        for pattern in (f"[{HAN}] ?[,;:!?](?=\\s|$)", f"[,;:] ?[{HAN}]", f"\\([^()]*[{HAN}][^()]*\\)", f"[{HAN}]\\.(?=\\s|$)"):
            wrong += [f"{entry.msgid[:50]!r}: {found.group(0)!r}" for found in re.finditer(pattern, text)]
    assert not wrong, "\n".join(wrong)


def test_every_exercise_title_has_its_chinese_and_a_verdict_uses_it(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from fourcard_helpers import check

    chinese = {entry.msgid: entry.msgstr for entry in entries(translate.PACKAGE_CATALOG) if not entry.fuzzy}
    titles = [message.text for message in translate.exercise_titles()]
    assert len(titles) >= 50  # every lesson's exercises
    wrong = [title for title in titles if not re.fullmatch(r"练习 \d+：.+", chinese.get(title, ""))
             or title.split(":")[0].split()[-1] != chinese[title].split("：")[0].split()[-1]]
    assert not wrong, f"titles without a Chinese 练习 N：… of the same number: {wrong}"

    def not_attempted() -> None:
        raise NotImplementedError

    monkeypatch.setenv("FOURCARDS_LANG", "zh")
    check.exercise("Exercise 1: the all-reduced total", not_attempted)
    assert capsys.readouterr().out.startswith("○ 练习 1：全归约后的总和：还没有作答。")
