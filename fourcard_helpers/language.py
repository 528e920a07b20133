"""The learner's language for what the package tells them when something goes wrong.

The launcher's failure explanations (diagnose.py) and the doctor's warnings (doctor.py) are
what a learner reads at the worst moment, so they come in the learner's language: Chinese when
the setting FOURCARDS_LANG says so (`zh`), or, without it, when the locale does (LANGUAGE,
LC_ALL, LC_MESSAGES, LANG, read as gettext reads them); English otherwise, and for any message
the catalog does not hold. The catalog is locale/zh_CN/LC_MESSAGES/fourcard_helpers.po,
compiled beside it by `python docs/translate.py update`.

A message is written `_("... {name} ...").format(name=value)`: the catalog holds the text with
its placeholders, so a translation can put them where its grammar wants them.
"""
from __future__ import annotations

import gettext
import os
from pathlib import Path

LOCALE = Path(__file__).resolve().parent / "locale"
SETTING = "FOURCARDS_LANG"


def languages() -> list[str] | None:
    """The languages asked for by FOURCARDS_LANG, in gettext's names; None: the locale decides."""
    chosen = os.environ.get(SETTING, "").strip()
    if not chosen:
        return None
    return ["zh_CN" if name.strip().lower().replace("-", "_") in ("zh", "zh_cn", "zh_hans") else name.strip()
            for name in chosen.split(":")]


def _(message: str) -> str:
    """`message` in the learner's language. Read at each call, so that setting FOURCARDS_LANG in
    a notebook takes effect at once; gettext keeps each catalog it has read."""
    return gettext.translation("fourcard_helpers", LOCALE, languages=languages(), fallback=True).gettext(message)


def N_(message: str) -> str:
    """Marks a message kept in a constant for the catalog; `_()` translates it where it is used."""
    return message
