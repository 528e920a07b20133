"""The shipped Tang quatrains (data/tang_quatrains.txt) and the rules of the script that builds them."""
from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

from helpers import ROOT

DATA = ROOT / "data"
sys.path.insert(0, str(DATA))

from build_tang_quatrains import quatrains  # noqa: E402  (data/ is not a package)


def shipped() -> list[str]:
    return (DATA / "tang_quatrains.txt").read_text(encoding="utf-8").splitlines()


def test_the_file_is_the_one_data_readme_describes() -> None:
    raw = (DATA / "tang_quatrains.txt").read_bytes()
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    assert f"{hashlib.sha256(raw).hexdigest()}  tang_quatrains.txt" in readme
    assert len(raw) <= 1.5e6 and f"{len(raw):,} bytes" in readme
    poems = shipped()
    five, seven = sum(len(p) == 24 for p in poems), sum(len(p) == 32 for p in poems)
    for figure in (f"{len(poems):,} quatrains", f"{five:,} of five characters", f"{seven:,} of seven",
                   f"{len(set(''.join(poems))):,} distinct characters"):
        assert figure in readme, figure


def test_every_line_is_one_quatrain_in_the_stated_layout_and_none_twice() -> None:
    poems = shipped()
    assert len(poems) == len(set(poems)) > 10_000
    for poem in poems:
        n = len(poem) // 4 - 1  # characters a line: 24 → 5, 32 → 7
        assert n in (5, 7) and len(poem) == 4 * (n + 1), poem
        words = [poem[i * (n + 1):(i + 1) * (n + 1) - 1] for i in range(4)]
        marks = [poem[(i + 1) * (n + 1) - 1] for i in range(4)]
        assert marks[0] == marks[2] == "，" and marks[1] in "。？！" and marks[3] in "。？！", poem
        assert not any(re.search(r"[，。？！、；：「」『』《》（）()□\s]", word) for word in words), poem


def test_the_build_keeps_quatrains_once_in_order_and_nothing_else(tmp_path: Path) -> None:
    folder = tmp_path / "全唐诗"
    folder.mkdir()
    poems = [
        ["春眠不觉晓，处处闻啼鸟。", "夜来风雨声，花落知多少。"],                # five a line: kept
        ["朝辞白帝彩云间，千里江陵一日还。", "两岸猿声啼不住，轻舟已过万重山。"],  # seven a line: kept
        ["春眠不觉晓，处处闻啼鸟。", "夜来风雨声，花落知多少。"],                # the first again: dropped
        ["春眠不觉□，处处闻啼鸟。", "夜来风雨声，花落知多少。"],                # a missing character
        ["春眠不觉晓，处处闻啼鸟。", "夜来风雨声，花落知多少。", "春眠不觉晓，处处闻啼鸟。"],  # six lines
        ["春眠不觉晓，处处闻啼鸟。", "两岸猿声啼不住，轻舟已过万重山。"],        # five, then seven
        ["春眠不觉晓。处处闻啼鸟，", "夜来风雨声，花落知多少。"],                # marks the other way round
    ]
    # Two files, numbered so that a sort by name alone (10 before 2) would get the order wrong.
    (folder / "poet.tang.10.json").write_text(json.dumps([{"paragraphs": p} for p in poems[2:]]), encoding="utf-8")
    (folder / "poet.tang.2.json").write_text(json.dumps([{"paragraphs": p} for p in poems[:2]]), encoding="utf-8")
    assert quatrains(folder) == ["".join(poems[0]), "".join(poems[1])]
    # Deduplicated after conversion: two variants that convert to the same text are one poem.
    (folder / "poet.tang.10.json").write_text(json.dumps([{"paragraphs": ["春眠不覺曉，處處聞啼鳥。", "夜來風雨聲，花落知多少。"]}]),
                                              encoding="utf-8")
    simplify = str.maketrans("覺曉處聞鳥來風聲", "觉晓处闻鸟来风声")
    assert quatrains(folder, lambda text: text.translate(simplify)) == ["".join(poems[0]), "".join(poems[1])]
    assert len(quatrains(folder)) == 3  # without the conversion they differ
