"""The Chinese notebooks show what a Chinese learner sees: figures and widgets in Chinese, drawn with a
font that has every glyph, and stored outputs made by running the Chinese notebooks themselves.

nbval runs two Chinese lessons again (conftest.py: CHINESE_NBVAL); the tests here show that every
other one is built the same way: its code is the English code with only the text of its figures
and widgets translated (string literals, nothing else), and its stored outputs come from a run, top
to bottom, of exactly that code (`python docs/translate.py run NN`). All of it reads files; no kernel.
"""
from __future__ import annotations

import ast
import json
import re
import sys
import tomllib
import warnings
from collections import Counter
from pathlib import Path

import matplotlib
import polib
import pytest

matplotlib.use("agg")
import matplotlib.pyplot as plt  # noqa: E402

from helpers import ROOT  # noqa: E402

sys.path.insert(0, str(ROOT / "docs"))

import translate  # noqa: E402

from fourcard_helpers import plots  # noqa: E402

LESSONS = translate.lessons()
IDS = [lesson.stem for lesson in LESSONS]
HAN = re.compile(r"[\u4e00-\u9fff]")


def chinese_notebook(lesson: Path) -> dict:
    return json.loads((translate.CHINESE_NOTEBOOKS / lesson.name).read_text(encoding="utf-8"))


def code_entries() -> list[tuple[str, polib.POEntry]]:
    return [(lesson.stem, entry) for lesson in LESSONS for entry in polib.pofile(str(translate.lesson_catalog(lesson)))
            if translate.is_code_context(entry.msgctxt) and entry.msgstr and not entry.obsolete]


# -- what counts as figure text ------------------------------------------------------------------
def test_the_figures_and_widgets_the_learner_meets_are_found() -> None:
    """The diagrams and widgets a Chinese learner met in English: each is figure text to translate."""
    found = {lesson.stem[:3]: {message.text for message in translate.code_messages(lesson)} for lesson in LESSONS}
    assert {'"One step of data parallelism: split the batch, average the gradients, apply the same update"',
            'f"shard {k}\\n16 digits"', '"per-card batch"', '"cards"'} <= found["02_"]
    assert {'"cards"', '"batch/card"', 'f"card {r}"'} <= found["04_"]
    assert {'f"card {lane}"', '"Naive split, one training step (measured)"', '"time (forward = 1, backward = 2)"'} <= found["07_"]
    assert {'"params (B)"', '"checkpointing"', '"tokens/card"'} <= found["09_"]
    assert any(text.startswith('"The 2 × 2 world') for text in found["12_"])
    code = [text for texts in found.values() for text in texts]
    assert not any(text in ('"#4C72B0"', '"o-"', '"center"', '"cuda"') for text in code)  # formats, colours, data


def test_a_changed_literal_is_a_new_entry_and_the_old_one_is_kept_obsolete() -> None:
    old = polib.POFile()
    old.append(polib.POEntry(msgctxt="c1" + translate.CODE, msgid='"step"', msgstr='"步"'))
    old.append(polib.POEntry(msgctxt="c1", msgid="A cell.", msgstr="一个单元格。"))
    messages = [translate.Message("c1", "A cell.", "lesson.ipynb", "cell", 1),
                translate.Message("c1" + translate.CODE, '"steps"', "lesson.ipynb", "code", 2)]
    merged = {(entry.msgid, entry.obsolete): entry for entry in translate.merge(old, messages)}
    assert merged['"steps"', False].msgstr == "" and not merged['"steps"', False].fuzzy  # not handed another literal's text
    assert merged['"step"', True].msgstr == '"步"' and merged["A cell.", False].msgstr == "一个单元格。"


def test_a_translation_replaces_its_literal_where_it_is_text_and_nowhere_else() -> None:
    source = ('%matplotlib inline\nax.set_title("loss")  # "loss"\nlabels = {"loss": "loss"}\nprint(labels["loss"], \'loss\')\n'
              'ax.plot(x, label="loss" if kind == "loss" else None)\nax.text(0, 0, f"卡 {k}: {\'a\'}")\n')
    chinese = translate.translated_code(source, {'"loss"': '"损失"', 'f"卡 {k}: {\'a\'}"': 'f"卡 {k}：{\'a\'}"'})
    assert chinese == ('%matplotlib inline\nax.set_title("损失")  # "loss"\nlabels = {"loss": "损失"}\nprint(labels["loss"], \'loss\')\n'
                       'ax.plot(x, label="损失" if kind == "loss" else None)\nax.text(0, 0, f"卡 {k}：{\'a\'}")\n')


# -- the Chinese code is the English code, its text translated -----------------------------------
class Blanked(ast.NodeTransformer):
    """A tree with every string literal's text blanked, an f-string's placeholders kept, and no
    widget's description (the Chinese lesson gives one to a widget that shows its parameter's name)."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        node.keywords = [keyword for keyword in node.keywords if keyword.arg != "description"]
        return self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.Constant("") if isinstance(node.value, str) else node

    def visit_JoinedStr(self, node: ast.JoinedStr) -> ast.AST:
        return ast.JoinedStr([self.visit(value.value) for value in node.values if isinstance(value, ast.FormattedValue)])


def blanked(source: str) -> str:
    tree = translate._parsed(source)
    return ast.dump(Blanked().visit(tree)) if tree is not None else source


@pytest.mark.parametrize("lesson", LESSONS, ids=IDS)
def test_the_chinese_code_differs_from_the_english_in_string_literals_only(lesson: Path) -> None:
    """Magic lines (the first cell's `%fourcards_lang zh`), comments and widgets' descriptions aside,
    the same program: the outputs of nbval's two Chinese lessons stand for the rest."""
    english = json.loads(lesson.read_text(encoding="utf-8"))["cells"]
    chinese = chinese_notebook(lesson)["cells"]
    differ = [index for index, (en, zh) in enumerate(zip(english, chinese)) if en["cell_type"] == "code"
              and blanked("".join(en["source"])) != blanked("".join(zh["source"]))]
    assert not differ, f"{lesson.name}: code cells {differ} differ from the English beyond their text"


def placeholders(literal: str) -> Counter[str]:
    """An f-string's placeholders, their own string literals blanked (`{'4 GPUs' if ...}` is translated too)."""
    node = ast.parse("(" + literal + ")", mode="eval").body
    assert isinstance(node, (ast.Constant, ast.JoinedStr)), literal
    return Counter(ast.dump(Blanked().visit(value.value)) for value in getattr(node, "values", [])
                   if isinstance(value, ast.FormattedValue))


def test_each_translated_literal_is_a_literal_with_the_same_placeholders() -> None:
    wrong = [f"{stem}: {entry.msgid} → {entry.msgstr}" for stem, entry in code_entries()
             if type(ast.parse("(" + entry.msgstr + ")", mode="eval").body) is not type(ast.parse("(" + entry.msgid + ")", mode="eval").body)
             or placeholders(entry.msgstr) != placeholders(entry.msgid)]
    assert not wrong, "\n".join(wrong)
    assert sum(bool(HAN.search(entry.msgstr)) for _, entry in code_entries()) > 150  # most are Chinese text


# -- the outputs come from running that code -----------------------------------------------------
@pytest.mark.parametrize("lesson", LESSONS, ids=IDS)
def test_the_stored_outputs_come_from_a_run_of_this_code(lesson: Path) -> None:
    notebook = chinese_notebook(lesson)
    assert notebook["metadata"].get(translate.RAN) == translate.code_digest(translate.chinese_lesson(lesson)), (
        f"notebooks/zh/{lesson.name}: its stored outputs are not from a run of its current code: "
        f"python docs/translate.py run {lesson.stem.split('_')[0]}")
    counts = [cell["execution_count"] for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert counts == list(range(1, len(counts) + 1)), "not one run, top to bottom, in a fresh kernel"


def outputs_text(notebook: dict) -> str:
    return "\n".join("".join(output.get("text", "")) + "".join(output.get("data", {}).get("text/plain", ""))
                     for cell in notebook["cells"] if cell["cell_type"] == "code" for output in cell["outputs"])


@pytest.mark.parametrize("lesson", LESSONS, ids=IDS)
def test_the_stored_outputs_miss_no_glyph_and_name_no_path_of_this_machine(lesson: Path) -> None:
    text = outputs_text(chinese_notebook(lesson))
    assert translate.MISSING_GLYPH not in text
    assert not re.search(r"/(?:work|root|tmp)/", text), re.search(r".{0,60}/(?:work|root|tmp)/.{0,60}", text).group(0)


# -- the font ------------------------------------------------------------------------------------
def test_every_install_brings_the_font() -> None:
    """The README's Start command installs no extra: the font must come with the course itself."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert any(need.startswith("noto-cjk-sans-otc") for need in project["dependencies"])
    assert plots.use_cjk_font() and plots.CJK_FAMILY in plt.rcParams["font.family"]


def draw(text: str) -> None:
    """Draw `text` as a figure does, matplotlib's missing-glyph warning made an error."""
    fig = plt.figure(figsize=(2, 1), dpi=plots.DPI)
    try:
        fig.text(0.5, 0.5, text)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*missing from font")
            fig.canvas.draw()
    finally:
        plt.close(fig)


def figure_texts() -> list[str]:
    """Every Chinese text a figure shows: the lessons' translated literals (an f-string's text between
    its placeholders) and the words plots.py draws itself."""
    texts = []
    for _, entry in code_entries():
        node = ast.parse("(" + entry.msgstr + ")", mode="eval").body
        texts += [node.value] if isinstance(node, ast.Constant) else [
            part.value for part in node.values if isinstance(part, ast.Constant)]
    package = {entry.msgid: entry.msgstr for entry in polib.pofile(str(translate.PACKAGE_CATALOG))}
    texts += [package[word] for word in (*plots.PIPELINE_KINDS, "unspecified", "card {card}")]
    return [text for text in texts if HAN.search(text)]


def test_no_glyph_of_a_chinese_figure_is_missing() -> None:
    texts = figure_texts()
    assert len(texts) > 150
    for text in texts:
        draw(text)
    with matplotlib.rc_context({"font.family": ["sans-serif"]}):  # without the CJK font: the check fails
        with pytest.raises(UserWarning, match="missing from font"):
            draw(texts[0])


def test_plots_draws_its_own_words_in_the_learners_language(monkeypatch: pytest.MonkeyPatch) -> None:
    from fourcard_helpers import language

    monkeypatch.delenv(language.SETTING, raising=False)
    language.choose("zh")  # as a Chinese notebook's first cell does
    try:
        fig = plots.timeline([("卡 0", 0, 1, "forward"), ("卡 0", 1, 3, "backward")])
        panels = plots.card_values([("之前", [[1.0], None])])
    finally:
        language.choose(None)
    assert [text.get_text() for text in fig.axes[0].get_legend().get_texts()] == ["前向", "反向"]
    assert [label.get_text() for label in panels.axes[0].get_yticklabels()] == ["卡 0", "卡 1"]
    assert "未定义" in [text.get_text() for text in panels.axes[0].texts]
    plt.close("all")


# -- labels made from the lesson's own data, widgets without a description, verdicts ------------
def test_labels_made_from_the_lessons_data_are_found_and_data_from_outside_is_not() -> None:
    """A legend, lane or tick the code builds from a dictionary, a list of events or a loop is figure
    text; a word that leaves the notebook (a job's name handed to sbatch) or comes from the ranks is not."""
    messages = {lesson.stem[:3]: translate.code_messages(lesson) for lesson in LESSONS}
    data = {stem: {m.text for m in found if m.context == translate.DATA} for stem, found in messages.items()}
    cells = {stem: {m.text for m in found if m.context != translate.DATA} for stem, found in messages.items()}
    assert {'"scatter the batch"', '"card 0 (master)"'} <= data["03_"] and 'f"card {k}"' in cells["03_"]  # a timeline's events
    assert {'"default loader"', '"4 threads"', '"raw 0–255"'} <= data["04_"]  # dict keys, looked up as well
    assert '"without set_epoch"' in cells["04_"] and '"without set_epoch"' not in data["04_"]  # also the ranks' key
    assert '"no warm-up"' in data["02_"] and '"SGD + momentum"' in data["09_"]
    assert any(text.startswith('"MnistCNN, batch 64') for text in data["05_"])
    assert {'"stages"', '"micro_batches"'} <= cells["07_"] and '"optimizer"' in cells["09_"]  # widgets' names
    assert '"resumed"' in cells["12b"] and '"resumed"' not in data["12b"]  # shown, but also looked for in a job's output
    assert not {'"straight"', '"killed"'} & data["12b"]  # job names: sbatch and the files use them...
    assert {'"straight"', '"killed"'} <= {m.text for m in messages["12b"] if m.number == 50}  # ...the lanes show them
    assert {'"waiting for a batch"', '"waiting (GIL released)"', '"backward (compute)"'} <= data["04_"] | data["10_"]  # compared
    assert {'"weights"', '"tensors"'} <= cells["09_"] and not {'"weights"', '"tensors"'} & data["09_"]  # labels of keys
    assert any("as fast as one thread" in text for text in cells["04_"])  # a printed line with a translated label in it


def test_a_value_is_renamed_wherever_the_lesson_uses_it_and_nowhere_it_leaves() -> None:
    cells = ['rates = {"light load": 1.0, "heavy load": 2.0, "to disk": 3.0, "in ranks": 4.0, "a state": 5.0,\n'
             '         "with offload": 6.0}\nsave("to disk")\nhost = [name for name in rates if name.endswith("offload")]\n',
             'for name, rate in rates.items():\n    ax.bar(name, rate, label=name)\n'
             'assert rates["light load"] < rates["heavy load"]\nprint(f"{rates[\'light load\']}", "a state" in line)\n',
             '%%torchrun -n 2\nreport(kind="in ranks")\n']  # a file's name, compared words, the ranks' word: data
    notebook = {"cells": [{"cell_type": "code", "id": f"c{n}", "source": source} for n, source in enumerate(cells)]}
    strings, values = translate.shown_values(notebook, {}, beside="")
    assert values == {"light load", "heavy load"} and not strings
    chinese = translate.translated_code(cells[1], {}, {"light load": '"轻负载"', "heavy load": '"重负载"'})
    assert chinese == ('for name, rate in rates.items():\n    ax.bar(name, rate, label=name)\n'
                       'assert rates["轻负载"] < rates["重负载"]\nprint(f"{rates[\'轻负载\']}", "a state" in line)\n')


def test_a_label_given_apart_from_its_key_is_translated_and_the_key_is_not() -> None:
    cells = ['KINDS = {"weights": "weights", "to disk": "to disk"}\n',
             'save("weights")\nfor kind, shown in KINDS.items():\n    ax.bar(kind, parts[kind], label=shown)\n'
             'print(f"{kind}: {parts[kind]} bytes", "weights" == kind)\n']
    notebook = {"cells": [{"cell_type": "code", "id": f"c{n}", "source": source} for n, source in enumerate(cells)]}
    strings, values = translate.shown_values(notebook, {}, beside="")
    assert values == {"to disk"}  # "weights" leaves the notebook (save), "to disk" does not
    assert [(cell, translate._constant_text(literal)) for cell, literal in strings] == [
        (0, "weights"), (1, ":   bytes")]  # the label, in its cell; the line that prints a translated value
    assert translate.translated_code(cells[0], {'"weights"': '"权重"'}, {"to disk": '"写盘"'}) == (
        'KINDS = {"weights": "权重", "写盘": "写盘"}\n')  # the key kept, as save() and parts[kind] have it


def test_a_widget_without_a_description_gets_its_parameters_name_in_chinese() -> None:
    source = 'interact(f, n=IntSlider(4, 1, 8), m=Dropdown(options=[1]), k=IntSlider(2, description="k"))\n'
    assert [name for name, _ in translate.widget_names(ast.parse(source))] == ["n", "m"]
    assert translate.translated_code(source, {'"n"': '"卡数"', '"m"': '"m"'}) == (
        'interact(f, n=IntSlider(4, 1, 8, description="卡数"), m=Dropdown(options=[1]), k=IntSlider(2, description="k"))\n')


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: lesson.stem)
def test_no_label_from_data_no_widget_name_and_no_verdict_stays_english(lesson: Path) -> None:
    """The built Chinese code, scanned: no value the catalog translates is left in English in any code
    cell, nor a label or printed line its catalog translates in that cell (a dictionary's value that
    labels a key, a line printed with a translated value in it), every widget of interact() shows a
    Chinese description (or a name kept as it is), and each line printed with a verdict's mark (✓)
    says it in Chinese."""
    catalog = translate.translated(polib.pofile(str(translate.lesson_catalog(lesson))))
    values = {ast.literal_eval(english) for (context, english), text in catalog.items()
              if context == translate.DATA and text != english}
    wrong = []
    for cell in chinese_notebook(lesson)["cells"]:
        source = "".join(cell["source"])
        tree = translate._parsed(source) if cell["cell_type"] == "code" else None
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.Constant) and node.value in values:
                wrong.append(f"cell {cell['id']}: {node.value!r} is still English")
            if (isinstance(node, ast.Call) and translate._call_name(node) == "print" and node.args
                    and any(translate._constant_text(literal).startswith(translate.VERDICTS)
                            for literal in translate._literals_in(node.args[0]))
                    and not any(HAN.search(translate._constant_text(literal)) for literal in translate._literals_in(node.args[0]))):
                wrong.append(f"cell {cell['id']}: a verdict in English")
        changed = {english for (context, english), text in catalog.items()  # its labels, its printed lines
                   if context == cell["id"] + translate.CODE and text != english}
        wrong += [f"cell {cell['id']}: {text} is still English where it is shown" for text in
                  (source[slice(*translate._segment(source, literal))] for literal in translate._text_literals(tree))
                  if text in changed] if tree else []
        for name, _ in translate.widget_names(tree) if tree else ():
            if catalog.get((cell["id"] + translate.CODE, f'"{name}"'), f'"{name}"') != f'"{name}"':
                wrong.append(f"cell {cell['id']}: the widget {name} shows its parameter's name")
    assert not wrong, "\n".join(wrong)
