"""Rebuild data/tang_quatrains.txt from its source: the Complete Tang Poems of the chinese-poetry project.

    python data/build_tang_quatrains.py PATH        # PATH: a checkout of github.com/chinese-poetry/chinese-poetry

The source (MIT licence) holds the Complete Tang Poems (全唐诗) as JSON, in traditional characters,
one file per thousand poems (`全唐诗/poet.tang.N.json`), each poem with its lines in `paragraphs`.
Kept here: the quatrains (绝句), four lines of five or of seven characters, in the layout
the source gives them (two entries of two lines each, a comma after the first line of each pair and
a full stop, question or exclamation mark after the second), with no missing character (□) and no
other mark inside a line. A poem that appears twice (the same four lines under two names, as
happens in the collection, or lines that differ only in a variant character that becomes the same
simplified one) is kept once, where it first appears, in the order of the files.

The characters are converted to simplified ones, as the course is written, with OpenCC's
traditional-to-simplified table (`opencc-python-reimplemented`, version below: a pure-Python
port of OpenCC's dictionaries, needed only here, not by the course). One poem per line, UTF-8, no
title or author: the lines are what the model of lesson 13 learns to write.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

OPENCC_VERSION = "0.1.7"
OUT = Path(__file__).resolve().parent / "tang_quatrains.txt"
MARKS = "，。？！、；：「」『』《》（）()□"  # inside a line, none of these may appear
PAIR = {n: re.compile(rf"^[^{MARKS}\s]{{{n}}}，[^{MARKS}\s]{{{n}}}[。？！]$") for n in (5, 7)}


def quatrains(tang_folder: Path, convert: Callable[[str], str] = str) -> list[str]:
    """Every quatrain of five or seven characters a line, converted, then deduplicated, in the order of the files."""
    files = sorted(tang_folder.glob("poet.tang.*.json"), key=lambda path: int(path.name.split(".")[2]))
    if not files:
        sys.exit(f"no poet.tang.*.json in {tang_folder}: pass the root of a chinese-poetry checkout")
    kept, seen = [], set()
    for path in files:
        for poem in json.loads(path.read_text(encoding="utf-8")):
            lines = poem["paragraphs"]
            if len(lines) == 2 and any(all(PAIR[n].match(line) for line in lines) for n in (5, 7)):
                text = convert("".join(lines))
                if text not in seen:
                    seen.add(text)
                    kept.append(text)
    return kept


def simplified_converter() -> Callable[[str], str]:
    """OpenCC's traditional-to-simplified conversion, from the pinned pure-Python port (installed into a
    temporary folder with pip, so that nothing is added to the course's environment)."""
    folder = tempfile.mkdtemp()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", folder,
                    f"opencc-python-reimplemented=={OPENCC_VERSION}"], check=True)
    sys.path.insert(0, folder)
    from opencc import OpenCC  # noqa: PLC0415 - only after the install above

    return OpenCC("t2s").convert


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path, help="the root of a chinese-poetry checkout")
    args = parser.parse_args(argv)
    simplified = quatrains(args.checkout / "全唐诗", simplified_converter())
    OUT.write_text("".join(poem + "\n" for poem in simplified), encoding="utf-8")
    data = OUT.read_bytes()
    print(f"{len(simplified)} quatrains ({sum(len(p) == 24 for p in simplified)} of five characters a line, "
          f"{sum(len(p) == 32 for p in simplified)} of seven), {len(set(''.join(simplified)))} distinct characters, "
          f"{len(data):,} bytes; sha256 {hashlib.sha256(data).hexdigest()}  {OUT.name}")


if __name__ == "__main__":
    main()
