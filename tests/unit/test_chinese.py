"""The Chinese edition (docs/translate.py) is complete, built, and in step with the English.

A changed English cell makes its lesson's test fail here (stale), until the cell is translated
again; a Chinese notebook whose code or outputs differ from the English fails; so does a
translation that lost a number, a piece of code or a glossary term on the way.
"""
from __future__ import annotations

import ast
import json
import re
import shutil
import sys
import tomllib
from collections import Counter
from functools import cache
from pathlib import Path

import polib
import pytest

from fourcard_helpers.rundir import LANG_ENV  # noqa: E402
from helpers import ROOT  # noqa: E402

sys.path.insert(0, str(ROOT / "docs"))

import translate  # noqa: E402  (docs/translate.py: the one definition of what is built)

LESSONS = translate.lessons()
SEED_ARTICLE = ROOT / "docs" / "zh" / "seed_article.txt"  # the Chinese article the course grew from


def lesson_ids(paths: list[Path]) -> list[str]:
    return [path.stem for path in paths]


# -- complete and built ------------------------------------------------------------------------
@pytest.mark.parametrize("lesson", LESSONS, ids=lesson_ids(LESSONS))
def test_every_cell_of_the_lesson_is_translated_and_current(lesson: Path) -> None:
    found = translate.problems([(translate.lesson_catalog(lesson), translate.lesson_messages(lesson))])
    assert not found, ("the Chinese edition lags the English; translate these cells in the catalog "
                       "(after `python docs/translate.py update`):\n" + "\n".join(found))


@pytest.mark.parametrize("lesson", LESSONS, ids=lesson_ids(LESSONS))
def test_the_chinese_notebook_is_what_the_catalog_builds(lesson: Path) -> None:
    built = translate.CHINESE_NOTEBOOKS / lesson.name
    assert built.exists(), f"{built.relative_to(ROOT)} is missing: run `python docs/translate.py build`"
    assert built.read_text(encoding="utf-8") == translate.built_lesson(lesson), (
        f"{built.relative_to(ROOT)} differs from what its catalog builds now: run `python docs/translate.py build`")


@pytest.mark.parametrize("lesson", LESSONS, ids=lesson_ids(LESSONS))
def test_the_code_is_the_english_with_its_figures_text_in_chinese(lesson: Path) -> None:
    """Code cells as translate.chinese_lesson makes them; their outputs are the Chinese notebook's own
    run's (tests/lessons/test_chinese_notebooks.py)."""
    english = json.loads(lesson.read_text(encoding="utf-8"))
    chinese = json.loads((translate.CHINESE_NOTEBOOKS / lesson.name).read_text(encoding="utf-8"))
    assert len(chinese["cells"]) == len(english["cells"])
    made = translate.chinese_lesson(lesson)["cells"]  # the whole lesson at once: its messages come from every cell
    for index, (en, zh) in enumerate(zip(english["cells"], chinese["cells"])):
        assert en["cell_type"] == zh["cell_type"] and en["id"] == zh["id"], f"cell {index}"
        if en["cell_type"] == "markdown":
            assert set(en) == set(zh) and en["metadata"] == zh["metadata"], f"cell {index}"
        else:  # the first code cell also chooses Chinese for the package's messages (translate.chinese_code)
            built = made[index]
            assert {**zh, "outputs": [], "execution_count": None} == {**built, "outputs": [], "execution_count": None}, (
                f"{lesson.name} cell {index}: the Chinese code cell differs from what the English and the catalog make")
    assert {key: value for key, value in chinese["metadata"].items() if key != translate.RAN} == {
        **english["metadata"], "language": "zh-CN"}


def test_the_chinese_notebooks_run_from_their_folder() -> None:
    """What the code cells open beside the notebook (scripts, records, model files) is reached
    from notebooks/zh/ through links to the English folder's files: one copy of each."""
    for name in translate.SHARED_WITH_ENGLISH:
        link = translate.CHINESE_NOTEBOOKS / name
        assert link.is_symlink() and link.resolve() == (translate.NOTEBOOKS / name).resolve(), name
    mentioned = set()
    for lesson in LESSONS:
        for cell in json.loads(lesson.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                mentioned |= set(re.findall(r"(?:scripts|measured)/[\w.-]+\.\w+|\b[\w-]+\.py\b", "".join(cell["source"])))
    shipped = {name for name in mentioned if (translate.NOTEBOOKS / name).exists()}
    assert len(shipped) > 20, shipped  # the scripts the lessons save and the records they read
    assert all((translate.CHINESE_NOTEBOOKS / name).exists() for name in shipped), sorted(
        name for name in shipped if not (translate.CHINESE_NOTEBOOKS / name).exists())


# -- the translation keeps what must not change ------------------------------------------------
def prose(markdown: str) -> str:
    """Markdown without code (fenced or inline), LaTeX, URLs and HTML tags."""
    text = re.sub(r"(```|~~~).*?\1", " ", markdown, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\$\$.*?\$\$|\$[^$\n]+\$", " ", text, flags=re.S)
    text = re.sub(r"https?://\S+|<[^>]+>", " ", text)
    return text


def numbers(markdown: str) -> Counter[str]:
    """Each number in the prose, as often as it is written (1,000 and 1000 alike)."""
    found = re.findall(r"(?<![\d.,])\d+(?:[.,]\d+)*(?!\d)", prose(markdown))
    return Counter(re.sub(r"(?<=\d),(?=\d{3})", "", number) for number in found)


MATH = r"\$\$.*?\$\$|\$[^$\n]+\$"
WORDS_IN_MATH = r"\\text\{[^{}]*\}"  # \text{effective batch}: words a formula writes, which a translation translates


def math_skeleton(formula: str) -> str:
    """A formula with the words of its \\text{...} left out: what a translation keeps, symbol for symbol."""
    return re.sub(WORDS_IN_MATH, r"\\text{}", formula)


def with_math_skeletons(markdown: str) -> str:
    return re.sub(MATH, lambda found: math_skeleton(found.group(0)), markdown, flags=re.S)


def kept_pieces(markdown: str) -> list[str]:
    """What a translation copies as it is: inline code, fenced blocks, LaTeX (but the words in its
    \\text{...}: math_skeleton), links' targets."""
    pieces = re.findall(r"(?:```|~~~).*?(?:```|~~~)", markdown, flags=re.S)
    rest = re.sub(r"(?:```|~~~).*?(?:```|~~~)", " ", markdown, flags=re.S)
    inline = r"`(?:[^`\n]|\n(?!\n))+`"  # a code span may wrap onto the next line
    pieces += re.findall(inline, rest)
    pieces += map(math_skeleton, re.findall(MATH, re.sub(inline, " ", rest), flags=re.S))
    pieces += [target for target in re.findall(r"\]\(([^)]+)\)", rest) if not target.endswith(".md")]  # X.md may become X.zh.md
    return [re.sub(r"\s+", " ", piece) for piece in pieces]  # wrapped differently is kept all the same


def headings(markdown: str) -> list[int]:
    text = re.sub(r"(```|~~~).*?\1", " ", markdown, flags=re.S)
    return [len(found) for found in re.findall(r"^(#+) ", text, flags=re.M)]


def translated_pairs(catalog: Path) -> list[tuple[str, str, str]]:
    return [(" ".join(entry.occurrences[0]) if entry.occurrences else "", entry.msgid, entry.msgstr)
            for entry in polib.pofile(str(catalog)) if entry.msgstr and not entry.obsolete]


ALL_CATALOGS = [translate.lesson_catalog(lesson) for lesson in LESSONS] + [
    ROOT / catalog for catalog, _ in translate.DOCUMENTS.values()]


@pytest.mark.parametrize("catalog", ALL_CATALOGS, ids=lesson_ids(ALL_CATALOGS))
def test_the_translation_keeps_code_numbers_and_headings(catalog: Path) -> None:
    wrong = []
    for where, english, chinese in translated_pairs(catalog):
        lost = [piece for piece in kept_pieces(english) if piece not in re.sub(r"\s+", " ", with_math_skeletons(chinese))]
        if lost:
            wrong.append(f"{where}: lost {lost[:3]}")
        missing = sorted((numbers(english) - numbers(chinese)).elements())  # each as often as in the English
        if missing:
            wrong.append(f"{where}: the number(s) {missing} are not in the Chinese (as often)")
        if headings(english) != headings(chinese):
            wrong.append(f"{where}: headings {headings(english)} became {headings(chinese)}")
        if english.count("\n|") != chinese.count("\n|"):
            wrong.append(f"{where}: a table lost or gained rows")
    assert not wrong, "\n".join(wrong)


def test_a_formula_may_translate_its_words_and_keeps_every_symbol() -> None:
    kept = kept_pieces(r"So $\text{effective batch} = \text{per-card batch} \times N$, and `n`.")
    assert kept[1] == r"$\text{} = \text{} \times N$"
    for chinese, keeps in ((r"$\text{有效批量} = \text{每卡批量} \times N$", True),
                           (r"$\text{有效批量} = \text{每卡批量} \times M$", False),  # a symbol changed
                           (r"$\text{有效批量} = \text{每卡批量} + N$", False),
                           (r"$\text{有效批量} = \text{每卡批量} \times N \times 2$", False)):
        assert (kept[1] in with_math_skeletons(chinese)) is keeps, chinese


def glossary() -> list[tuple[list[str], str, list[str]]]:
    """(English forms, Chinese term, Chinese forms not to use), from docs/zh/glossary.md."""
    rows = []
    for line in (ROOT / "docs" / "zh" / "glossary.md").read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and cells[0] not in ("English", "---"):
            avoid = [word.strip() for word in re.split(r"[、,]", cells[2]) if word.strip()]
            rows.append(([form.strip() for form in cells[0].split("/")], cells[1], avoid))
    return rows


def test_the_glossary_is_read() -> None:
    terms = {chinese for _, chinese, _ in glossary()}
    assert {"数据并行", "模型并行", "流水线并行", "张量并行", "全归约", "梯度累积", "混合精度", "激活重计算"} <= terms


@pytest.mark.parametrize("catalog", ALL_CATALOGS, ids=lesson_ids(ALL_CATALOGS))
def test_glossary_terms_are_used_throughout(catalog: Path) -> None:
    terms = sorted(glossary(), key=lambda row: -max(len(form) for form in row[0]))  # longest first
    wrong = []
    for where, english, chinese in translated_pairs(catalog):
        text, chinese_prose = re.sub(r"\s+", " ", prose(english)), prose(chinese)  # a term may wrap across lines
        for forms, term, avoid in terms:
            pattern = r"\b(?:" + "|".join(re.escape(form).replace(r"\-", "[- ]?") for form in forms) + r")(?:s|es|ed|ing)?\b"
            if re.search(pattern, text, flags=re.I):
                text = re.sub(pattern, " ", text, flags=re.I)  # a longer term took it: 'activation checkpointing'
                if term not in chinese:
                    wrong.append(f"{where}: '{forms[0]}' is translated without '{term}'")
            wrong += [f"{where}: '{word}' is used; the glossary's term is '{term}'" for word in avoid if word in chinese_prose]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("catalog", ALL_CATALOGS, ids=lesson_ids(ALL_CATALOGS))
def test_quotes_of_the_seed_article_are_its_own_words(catalog: Path) -> None:
    """The English quotes the seed article in translation; the Chinese edition quotes the
    original (in 「」, the mark it keeps for these quotes), copied exactly."""
    seed = re.sub(r"\s+", "", SEED_ARTICLE.read_text(encoding="utf-8"))
    wrong = [f"{where}: 「{quote}」 is not in the seed article"
             for where, _, chinese in translated_pairs(catalog)
             for quote in re.findall(r"「([^」]+)」", chinese) if re.sub(r"\s+", "", quote) not in seed]
    assert not wrong, "\n".join(wrong)


# -- documents ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(translate.DOCUMENTS))
def test_each_document_is_translated_current_and_built(name: str) -> None:
    catalog, chinese = translate.DOCUMENTS[name]
    found = translate.problems([(ROOT / catalog, translate.document_messages(name))])
    assert not found, "\n".join(found)
    assert (ROOT / chinese).read_text(encoding="utf-8") == translate.built_document(name), (
        f"{chinese} differs from what its catalog builds: run `python docs/translate.py build`")


def test_the_chinese_readme_gives_the_two_commands_and_the_chinese_interface() -> None:
    chinese = (ROOT / "README.zh.md").read_text(encoding="utf-8")
    assert ".venv/bin/pip install -e . && .venv/bin/jupyter lab notebooks/" in chinese  # opens the course
    assert '.venv/bin/pip install -e ".[dev]" && .venv/bin/python -m pytest' in chinese  # runs every test
    assert '.venv/bin/pip install -e ".[zh]"' in chinese
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert any(need.startswith("jupyterlab-language-pack-zh-cn") for need in extras["zh"])


# -- staleness is caught -----------------------------------------------------------------------
def test_a_changed_english_cell_makes_its_translation_stale(tmp_path: Path) -> None:
    """The mechanism the tests above rely on, end to end on a copy of a real lesson."""
    lesson = LESSONS[0]
    english, catalog = tmp_path / lesson.name, tmp_path / f"{lesson.stem}.po"
    shutil.copy(lesson, english)
    translated = polib.pofile(str(translate.lesson_catalog(lesson)))
    for entry in translated:  # as if every cell were translated, whatever the state of the real catalog
        entry.msgstr, entry.flags = entry.msgstr or "译文", [flag for flag in entry.flags if flag != "fuzzy"]
    translated.save(str(catalog))
    assert translate.problems([(catalog, translate.lesson_messages(english))]) == []

    notebook = json.loads(english.read_text(encoding="utf-8"))
    index, cell_id, text = translate.markdown_cells(notebook)[1]
    notebook["cells"][index]["source"] = text.replace(" ", "  ", 1)  # the smallest edit
    english.write_text(json.dumps(notebook), encoding="utf-8")
    found = translate.problems([(catalog, translate.lesson_messages(english))])
    assert len(found) == 1 and f"cell {index}" in found[0] and "stale" in found[0] and lesson.stem in found[0]

    merged = translate.merge(polib.pofile(str(catalog)), translate.lesson_messages(english))
    entry = next(entry for entry in merged if entry.msgctxt == cell_id)
    assert entry.fuzzy and entry.previous_msgid == text and entry.msgstr  # the old Chinese kept for the translator
    assert (cell_id, entry.msgid) not in translate.translated(merged)  # and built in English until redone


def paragraphs(*texts: str) -> list[translate.Message]:
    return [translate.Message(None, text, "doc.md", "paragraph", number) for number, text in enumerate(texts, 1)]


def catalog_of(*pairs: tuple[str, str]) -> polib.POFile:
    catalog = polib.POFile()
    for english, chinese in pairs:
        catalog.append(polib.POEntry(msgid=english, msgstr=chinese))
    return catalog


SENTENCES = (("The first paragraph of the page.", "第一段。"), ("The second paragraph of the page.", "第二段。"),
             ("A third, about something else entirely.", "第三段。"))


def test_a_changed_paragraph_keeps_its_old_translation_and_a_new_one_takes_none() -> None:
    one, two, three = (english for english, _ in SENTENCES)
    merged = {entry.msgid: entry for entry in translate.merge(
        catalog_of(*SENTENCES), paragraphs(one, "A paragraph never seen.", two + " Now longer.", three))}
    assert merged[two + " Now longer."].fuzzy and merged[two + " Now longer."].msgstr == "第二段。"
    assert merged[two + " Now longer."].previous_msgid == two
    assert merged["A paragraph never seen."].msgstr == ""  # not handed a neighbour's translation
    assert not merged[one].fuzzy and merged[three].msgstr == "第三段。"


def test_a_removed_text_is_kept_obsolete_and_comes_back_translated() -> None:
    one, two, three = (english for english, _ in SENTENCES)
    without = translate.merge(catalog_of(*SENTENCES), paragraphs(one, three))
    assert [entry.msgid for entry in without if entry.obsolete] == [two]
    again = {entry.msgid: entry for entry in translate.merge(without, paragraphs(one, two, three))}
    assert again[two].msgstr == "第二段。" and not again[two].fuzzy and not again[two].obsolete


def test_stale_through_two_edits_shows_the_english_it_was_translated_from() -> None:
    cell = [translate.Message("c1", text, "lesson.ipynb", "cell", 3) for text in ("E1.", "E2.", "E3.")]
    old = polib.POFile()
    old.append(polib.POEntry(msgctxt="c1", msgid="E1.", msgstr="中一。"))
    twice = translate.merge(translate.merge(old, [cell[1]]), [cell[2]])
    assert twice[0].fuzzy and twice[0].previous_msgid == "E1." and twice[0].msgstr == "中一。"
    back = translate.merge(twice, [cell[0]])  # the English went back to what was translated
    assert not back[0].fuzzy and back[0].msgstr == "中一。"


# -- the package's messages ------------------------------------------------------------------
def test_every_message_of_the_package_is_translated_with_its_placeholders() -> None:
    found = translate.problems([(translate.PACKAGE_CATALOG, translate.package_messages())])
    assert not found, "\n".join(found)
    for entry in polib.pofile(str(translate.PACKAGE_CATALOG)):
        assert sorted(re.findall(r"\{\w*\}", entry.msgstr)) == sorted(re.findall(r"\{\w*\}", entry.msgid)), entry.msgid
    assert len(translate.package_messages()) >= 30  # the launcher's explanations and the doctor's warnings
    assert translate.compiled_is_current(), (
        "the compiled catalog (.mo) does not hold the .po's current translations: run `python docs/translate.py build`")


def a_rank_that_aborted_at_exit(tmp_path: Path) -> str:
    from fourcard_helpers.diagnose import Ending, diagnose
    from fourcard_helpers.rundir import DONE, EXIT, RunDir

    tmp_path.mkdir()
    run = RunDir(tmp_path)
    for rank in range(4):
        run.write(DONE, rank, "")
    run.write_json(EXIT, 2, {"exitcode": -6, "signal": "SIGABRT"})
    return str(diagnose(run, 4, "[rank2] epoch 1: loss 0.31\n", Ending(returncode=1)))


def test_the_launchers_explanation_is_in_chinese_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    english = a_rank_that_aborted_at_exit(tmp_path / "en")
    assert english.startswith("rank 2 of 4 finished its script, then died while exiting, by SIGABRT.")
    monkeypatch.setenv(LANG_ENV, "zh")
    chinese = a_rank_that_aborted_at_exit(tmp_path / "zh")
    assert chinese.startswith("rank 2（共 4 个）跑完了脚本，却在退出时被 SIGABRT 终止。")
    assert "gloo 的退出竞争" in chinese and "exit_without_teardown()" in chinese
    assert chinese.endswith("它最后的输出：\n[rank2] epoch 1: loss 0.31\n")


@pytest.mark.parametrize("setting, chinese", [
    ({LANG_ENV: "zh"}, True), ({LANG_ENV: "zh-CN"}, True),
    ({LANG_ENV: "", "LANG": "zh_CN.UTF-8"}, True),  # the locale decides when the setting is empty
    ({LANG_ENV: "", "LANGUAGE": "zh_CN:en", "LANG": "en_US.UTF-8"}, True),
    ({LANG_ENV: "", "LANG": "fr_FR.UTF-8"}, False),  # no catalog: English
    ({LANG_ENV: "en", "LANG": "zh_CN.UTF-8"}, False),  # the setting wins over the locale
])
def test_the_language_follows_the_setting_then_the_locale(setting: dict[str, str], chinese: bool,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from fourcard_helpers.doctor import examine

    for name in ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG"):
        monkeypatch.delenv(name, raising=False)
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    record = {"steps": 3, "joined_group": True, "used_ddp": True, "collectives_while_training": 6,
              "collectives_at_end": 6, "weights": [], "sampler_epochs": [[0, 0]], "padded_evaluations": [],
              "saved_paths": [], "first_batches": []}
    [warning] = examine({0: record, 1: record}, 2)
    assert warning.startswith("一个打乱顺序的 DistributedSampler 被遍历了 2 次" if chinese else
                              "a shuffling DistributedSampler was iterated 2 times, every time with epoch 0")


def test_an_exercise_check_speaks_chinese_when_asked(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from fourcard_helpers import check

    def attempt() -> None:
        check.close([1.0, 2.5], [1.0, 2.0])

    with pytest.raises(check.CheckFailed):
        check.exercise("sum", attempt)
    monkeypatch.setenv(LANG_ENV, "zh")
    with pytest.raises(check.CheckFailed):
        check.exercise("sum", attempt)
    english, chinese = capsys.readouterr().out.splitlines()
    assert english == "✗ sum: not yet. your answer: differs from the expected value by up to 0.5 (tolerance 1e-06 + 1e-05·|x|)"
    assert chinese == "✗ sum——还不对。你的答案：与期望值最多相差 0.5（容差 1e-06 + 1e-05·|x|）"


def asserted_strings(source: str) -> list[str]:
    """The string constants inside a code cell's assert statements (magic lines left out)."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    try:
        tree = ast.parse(code)
    except SyntaxError:  # a cell of another language (%%bash, %%writefile of a non-Python file)
        return []
    return [node.value for statement in ast.walk(tree) if isinstance(statement, ast.Assert)
            for node in ast.walk(statement) if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def word_runs(text: str, length: int = 4) -> set[str]:
    words = re.findall(r"[A-Za-z']+", text.lower())
    return {" ".join(words[i:i + length]) for i in range(len(words) - length + 1)}


def test_no_lesson_asserts_the_english_wording_of_a_translated_message() -> None:
    """With FOURCARDS_LANG=zh (or a zh_CN locale) the doctor and the launcher speak Chinese, in the
    English lessons as in the Chinese ones: a lesson that asserted their English words would stop
    Run All there. Lessons check such messages by what no translation changes (names, numbers)."""
    translated = set()
    for message in translate.package_messages():
        for part in re.split(r"\{\w*\}", message.text):
            translated |= word_runs(part)
    found = [f"{lesson.name} cell {index}: assert on {text!r}"
             for lesson in LESSONS
             for index, cell in enumerate(json.loads(lesson.read_text(encoding="utf-8"))["cells"])
             if cell["cell_type"] == "code"
             for text in asserted_strings("".join(cell["source"]))
             if " " in text and word_runs(text) & translated]  # a lone name (`set_epoch`) is the same in Chinese
    assert not found, "\n".join(found)


# -- one rendering per meaning (docs/zh/glossary.md's TOML block) -------------------------------
# The glossary names, for each meaning, the chosen Chinese, the renderings no longer used, the
# English given once per lesson, and where 内存 (host RAM) is right; GPU memory is 显存. Every
# catalog is read as text: no process, no notebook.
LESSON_CATALOGS = [translate.lesson_catalog(lesson) for lesson in LESSONS]
CATALOGS = ALL_CATALOGS + [translate.PACKAGE_CATALOG]  # the lessons, the documents, the package
CJK = "\u3000-\u303f\u4e00-\u9fff\uff01-\uff60“”‘’…—"
HAN = "\u4e00-\u9fff"


@cache
def renderings() -> dict:
    block = re.search(r"```toml\n(.*?)```", (ROOT / "docs" / "zh" / "glossary.md").read_text(encoding="utf-8"), flags=re.S)
    assert block, "docs/zh/glossary.md has no ```toml block of renderings by meaning"
    return tomllib.loads(block.group(1))


@cache
def catalog_entries(catalog: Path) -> list[polib.POEntry]:
    """The translated entries, in the order a reader meets them (cell or paragraph number)."""
    def place(entry: polib.POEntry) -> int:
        try:
            return int(entry.occurrences[0][1])
        except (IndexError, ValueError):
            return 0
    return sorted((entry for entry in polib.pofile(str(catalog)) if entry.msgstr and not entry.obsolete), key=place)


def where(catalog: Path, entry: polib.POEntry) -> str:
    return f"{catalog.name} {' '.join(entry.occurrences[0]) if entry.occurrences else entry.msgid[:40]!r}"


def test_the_renderings_by_meaning_are_read() -> None:
    chosen = {term["use"] for term in renderings()["term"]}
    assert {"显存", "kernel", "数字图像", "对照", "全归约", "批量大小", "轮", "激活值", "卡住", "notebook"} <= chosen
    assert len(renderings()["memory_contexts"]) >= 4 and all(context["why"] for context in renderings()["memory_contexts"])


@pytest.mark.parametrize("catalog", CATALOGS, ids=[path.stem for path in CATALOGS])
def test_each_meaning_has_its_one_rendering(catalog: Path) -> None:
    wrong = []
    for entry in catalog_entries(catalog):
        chinese, english = prose(entry.msgstr), re.sub(r"\s+", " ", prose(entry.msgid))
        for term in renderings()["term"]:
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
    allowed = "|".join(f"(?:{context['pattern']})" for context in renderings()["memory_contexts"])
    wrong = [f"{where(catalog, entry)}: …{rest[max(0, found.start() - 15):found.end() + 10]}… (GPU memory is 显存; "
             "or add the context, with its reason, to the glossary's memory_contexts)"
             for entry in catalog_entries(catalog)
             for rest in [re.sub(allowed, "", prose(entry.msgstr))]
             for found in re.finditer("内存", rest)]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("catalog", LESSON_CATALOGS, ids=[path.stem for path in LESSON_CATALOGS])
def test_the_english_is_given_once_where_a_lesson_first_uses_a_term(catalog: Path) -> None:
    wrong = []
    live = catalog_entries(catalog)  # a stale entry too: its Chinese is what the translator revises
    for term in (term for term in renderings()["term"] if "english_once" in term):
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
    for entry in catalog_entries(catalog):
        text = re.sub(r"(```|~~~).*?\1", "", entry.msgstr, flags=re.S)
        for line, following in zip(text.split("\n"), text.split("\n")[1:]):
            if (line and following and re.match(f"[{CJK}]", line[-1]) and re.match(f"[{CJK}]", following[0])
                    and not line.lstrip().startswith(("#", "|"))):
                wrong.append(f"{where(catalog, entry)}: …{line[-12:]}⏎{following[:12]}…")
    assert not wrong, "\n".join(wrong)


def test_the_package_messages_use_full_width_punctuation_in_chinese() -> None:
    wrong = []
    for entry in catalog_entries(translate.PACKAGE_CATALOG):
        text = re.sub(r"`[^`]*`", " ", entry.msgstr)
        for pattern in (f"[{HAN}] ?[,;:!?](?=\\s|$)", f"[,;:] ?[{HAN}]", f"\\([^()]*[{HAN}][^()]*\\)", f"[{HAN}]\\.(?=\\s|$)"):
            wrong += [f"{entry.msgid[:50]!r}: {found.group(0)!r}" for found in re.finditer(pattern, text)]
    assert not wrong, "\n".join(wrong)


def test_every_exercise_title_has_its_chinese_and_a_verdict_uses_it(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from fourcard_helpers import check

    chinese = {entry.msgid: entry.msgstr for entry in catalog_entries(translate.PACKAGE_CATALOG) if not entry.fuzzy}
    titles = [message.text for message in translate.exercise_titles()]
    assert len(titles) >= 50  # every lesson's exercises
    wrong = [title for title in titles if not re.fullmatch(r"练习 \d+：.+", chinese.get(title, ""))
             or title.split(":")[0].split()[-1] != chinese[title].split("：")[0].split()[-1]]
    assert not wrong, f"titles without a Chinese 练习 N：… of the same number: {wrong}"

    def not_attempted() -> None:
        raise NotImplementedError

    monkeypatch.setenv(LANG_ENV, "zh")
    check.exercise("Exercise 1: the all-reduced total", not_attempted)
    assert capsys.readouterr().out.startswith("○ 练习 1：全归约后的总和——还没有作答。")


def check_descriptions(source: str) -> list[str]:
    """The literals a code cell gives check.close / check.equal / check.CheckFailed to say, as written."""
    tree = translate._parsed(source)
    return [source[slice(*translate._segment(source, literal))] for node in (ast.walk(tree) if tree else ())
            if isinstance(node, ast.Call) for text in translate.check_descriptions(node)
            for literal in translate._literals_in(text)]


def test_a_checks_description_is_found_and_translated_where_it_is_said() -> None:
    source = ('check.equal(got, want, f"rank {rank}\'s sum")\ncheck.close(a, b, what="the loss", atol=0)\n'
              'raise check.CheckFailed("run section 2 first")\nprint(f"rank {rank}\'s sum", "the loss" == name)\n')
    assert check_descriptions(source) == ['f"rank {rank}\'s sum"', '"the loss"', '"run section 2 first"']
    chinese = translate.translated_code(source, {'f"rank {rank}\'s sum"': 'f"rank {rank} 的和"', '"the loss"': '"损失"'})
    assert check_descriptions(chinese) == ['f"rank {rank} 的和"', '"损失"', '"run section 2 first"']
    assert chinese.endswith('print(f"rank {rank} 的和", "the loss" == name)\n')  # the comparison keeps its word


def test_a_verdicts_label_from_a_dictionary_is_its_cells_text_and_its_key_stays() -> None:
    """`print(f"✓ {BUILT[build]}, ...")`: the dictionary's values are what the line says (translated in
    the cell); its keys, which the launch reported, stay; a verdict's other placeholders are not followed."""
    launch = '%%torchrun -n 2\nreport(w={"by hand, GPipe": 1})\nprint("by hand" if x else "traced")\n'
    cell = ('BUILT = {"by hand": "by hand", "traced": "traced"}\nkinds = {"a": "plain words"}\n'
            'for setup in library:\n    build, schedule = setup.split(", ")\n'
            '    print(f"✓ {BUILT[build]}, {schedule}: {kinds[setup]} match")\n')
    notebook = {"cells": [{"cell_type": "code", "source": [source]} for source in (launch, cell)]}
    strings, values = translate.shown_values(notebook, {}, "")
    assert sorted(literal.value for index, literal in strings if index == 1) == ["by hand", "traced"] and not values
    chinese = translate.translated_code(cell, {'"by hand"': '"手动构建"', '"traced"': '"追踪构建"'})
    assert chinese.startswith('BUILT = {"by hand": "手动构建", "traced": "追踪构建"}\n')


def test_the_names_a_checks_verdict_says_are_text_where_the_cell_writes_them() -> None:
    """`raise check.CheckFailed(f"{case}: ...; {hint}")`: a name said only in what a check finds off is text
    where the cell writes it (`hint = "..."`), and so is a loop's name taken from tuples the cell wrote once
    (`cases = (("toy", 1), ...)`); a name the cell also computes with (`unit`) is not followed."""
    source = ('cases = (("toy", 1), ("the poet", 2))\nunit = "draws"\nfor case, k in cases:\n'
              '    hint = "draw among the k" if k else "no draw"\n'
              '    raise check.CheckFailed(f"{case}: off by {k} {unit}, {len(unit)}; {hint}")\n')
    found = [literal.value if isinstance(literal, ast.Constant) else "the verdict"
             for literal in translate.figure_literals(ast.parse(source), {})]
    assert found == ["toy", "the poet", "draw among the k", "no draw", "the verdict"]


@pytest.mark.parametrize("lesson", LESSONS, ids=lesson_ids(LESSONS))
def test_what_an_exercises_check_says_is_off_is_chinese(lesson: Path) -> None:
    """A ✗ verdict starts with what the check compared (`check.equal(got, want, "ranks that reported")`)
    or what it found off (`check.CheckFailed("...")`): in the built Chinese lesson each is Chinese, or
    kept as it is where the catalog says so (a name of the code's own: `f"steps_per_epoch({n}, {b})"`)."""
    kept = {key for key, text in translate.translated(polib.pofile(str(translate.lesson_catalog(lesson)))).items()
            if key[1] == text}
    notebook = json.loads((translate.CHINESE_NOTEBOOKS / lesson.name).read_text(encoding="utf-8"))
    said, wrong = 0, []
    for cell in notebook["cells"]:
        for text in check_descriptions("".join(cell["source"])) if cell["cell_type"] == "code" else ():
            said += 1
            if not re.search(f"[{HAN}]", text) and (cell["id"] + translate.CODE, text) not in kept:
                wrong.append(f"cell {cell['id']}: {text[:80]}")
    assert said, f"{lesson.name}: no check found to say what is off"  # every lesson's exercises have one
    assert not wrong, f"{lesson.name}: a check's description left English (translate it in its catalog):\n" + "\n".join(wrong)


# -- the Chinese notebook speaks Chinese by itself ----------------------------------------------
def test_a_message_put_together_from_pieces_keeps_chinese_punctuation(english_machine) -> None:
    """The catalog's own entries are checked above (full-width punctuation); a message the package puts
    together (a signal's name in parentheses, a hint after it) is checked here, as the learner reads it."""
    from fourcard_helpers import diagnose

    english_machine().choose("zh")
    crashed = diagnose._crashed(2, 4, "", "SIGSEGV", "")
    assert crashed.startswith("rank 2（共 4 个）在原生代码中崩溃（SIGSEGV）。SIGSEGV 是原生代码"), crashed


def test_sentences_put_together_take_a_space_in_english_only() -> None:
    from fourcard_helpers.language import sentences

    assert sentences("rank 2 crashed.", "SIGSEGV is a crash.") == "rank 2 crashed. SIGSEGV is a crash."
    assert sentences("rank 2 crashed.", "") == "rank 2 crashed. "  # as the English always had it
    assert sentences("rank 2 崩溃了。", "可能的原因：", "x") == "rank 2 崩溃了。可能的原因：x"


def test_an_empty_label_stays_empty_in_chinese(monkeypatch: pytest.MonkeyPatch) -> None:
    """plots.timeline() passes every lane and kind through the catalog; gettext answers "" with the
    catalog's header (its Project-Id-Version...), which a figure would then print."""
    from fourcard_helpers.language import _

    monkeypatch.setenv(LANG_ENV, "zh")
    assert _("") == "" and _("unspecified") != "unspecified"


def test_each_chinese_lesson_chooses_chinese_where_the_learner_sees_it() -> None:
    for lesson in LESSONS:
        notebook = json.loads((translate.CHINESE_NOTEBOOKS / lesson.name).read_text(encoding="utf-8"))
        first = "".join(next(cell for cell in notebook["cells"] if cell["cell_type"] == "code")["source"])
        assert first.startswith(translate.LOAD_EXTENSION + translate.SPEAK_CHINESE), lesson.name
    assert "%fourcards_lang en" in translate.SPEAK_CHINESE and LANG_ENV in translate.SPEAK_CHINESE


@pytest.fixture
def english_machine(monkeypatch: pytest.MonkeyPatch):
    """Call it to be on a machine whose locale is English, with no setting; it gives the package's
    language module, and the notebook's choice is undone after the test. Called by the test, so that
    the machine is English from that moment, whatever the fixtures before it set."""
    from fourcard_helpers import language

    def start():
        for name in (LANG_ENV, "LC_ALL", "LC_MESSAGES"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("LANGUAGE", "en")
        monkeypatch.setenv("LANG", "en_US.UTF-8")
        return language

    yield start
    language.choose(None)


def test_the_first_cell_of_a_chinese_lesson_makes_the_kernel_speak_chinese(
        english_machine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The Chinese lesson's own first lines, run by IPython as a kernel runs them (no JupyterLab, no
    locale, no setting): verdicts, the launcher's banner pieces and the ranks' environment follow."""
    from IPython.core.interactiveshell import InteractiveShell

    from fourcard_helpers import check, launch

    english_machine()
    shell = InteractiveShell.instance()
    try:
        shell.run_cell(translate.LOAD_EXTENSION + translate.SPEAK_CHINESE, store_history=False).raise_error()
        check.exercise("Exercise 1: the all-reduced total", lambda: (_ for _ in ()).throw(NotImplementedError))
        assert capsys.readouterr().out == "○ 练习 1：全归约后的总和——还没有作答。请在上面写下你的答案，再运行一次这个单元格。\n"
        cards = launch.detect(2)
        assert launch.rank_environment(cards, Path("run"), "cell.py", None)[LANG_ENV] == "zh"
        assert "张模拟卡（CPU 进程，gloo）" in cards.describe()
        monkeypatch.setenv(LANG_ENV, "en")  # the setting still wins over the notebook
        check.exercise("Exercise 1: the all-reduced total", lambda: (_ for _ in ()).throw(NotImplementedError))
        assert capsys.readouterr().out.startswith("○ Exercise 1: the all-reduced total: not attempted yet.")
        assert launch.rank_environment(cards, Path("run"), "cell.py", None)[LANG_ENV] == "en"
        shell.run_cell("%fourcards_lang", store_history=False).raise_error()
        assert capsys.readouterr().out == "Messages follow the setting FOURCARDS_LANG=en.\n"
    finally:
        InteractiveShell.clear_instance()


def test_without_the_line_the_kernel_speaks_as_before(english_machine) -> None:
    """An English lesson has no such line: English on an English machine, and the ranks get no setting."""
    from fourcard_helpers import launch

    english_machine()
    cards = launch.detect(2)
    assert LANG_ENV not in launch.rank_environment(cards, Path("run"), "cell.py", None)
    assert cards.describe().startswith("2 simulated cards (CPU processes, gloo)")


def test_the_launchers_help_and_argument_errors_follow_the_language_when_shown(english_machine) -> None:
    """`%%torchrun?` and a wrong option speak the language of the moment they are shown, not of the
    extension's load: one shell, English first, then Chinese after the notebook's line (argparse's
    own words stay argparse's)."""
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    english_machine()
    shell = InteractiveShell.instance()

    def shown() -> tuple[str, str]:
        help_text = shell.object_inspect_mime("%%torchrun")["text/plain"]
        with pytest.raises(UsageError) as error:
            shell.run_cell_magic("torchrun", "-n four", "raise NotImplementedError\n")
        return help_text, str(error.value)

    try:
        shell.run_cell(translate.LOAD_EXTENSION, store_history=False).raise_error()
        help_text, error = shown()
        assert "ranks to start (per node; default 4)" in help_text and "要启动" not in help_text
        assert error == ("%%torchrun: argument -n/--nproc: invalid int value: 'four'. "
                         "`%%torchrun?` shows its options and what each does.")
        shell.run_line_magic("fourcards_lang", "zh")
        help_text, error = shown()
        assert "用 torchrun 把这个单元格当作脚本" in help_text
        assert "要启动的 rank 数（每个节点；默认 4）" in help_text and "ranks to start" not in help_text
        assert error == ("%%torchrun：argument -n/--nproc: invalid int value: 'four'。"
                         "`%%torchrun?` 会列出它的选项以及每个选项的作用。")
    finally:
        InteractiveShell.clear_instance()
