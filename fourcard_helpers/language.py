"""The learner's language for what the package tells them.

Every message a learner reads from the package (a launch's banner and failure explanations, the
doctor's warnings, exercise verdicts, the pre-flight check) comes in the learner's language,
decided in this order:

1. the setting FOURCARDS_LANG (`zh`, `en`), where it is set: it always wins;
2. the notebook's own choice: a Chinese lesson (notebooks/zh/) says `%fourcards_lang zh` in its
   first code cell, under `%load_ext fourcard_helpers` (docs/translate.py writes that line, with a
   comment that tells the learner how to switch), so that the Chinese notebook speaks Chinese on
   any machine, whatever its locale, in JupyterLab, in nbval and in `jupyter nbconvert --execute`
   alike. It is a line the learner sees, not a guess from the notebook's path;
3. the locale (LANGUAGE, LC_ALL, LC_MESSAGES, LANG, read as gettext reads them);

English otherwise, and for any message the catalog does not hold. Launched ranks start with the
choice in their environment (launch.rank_environment), so what they print follows it. The catalog
is locale/zh_CN/LC_MESSAGES/fourcard_helpers.po, compiled beside it by `python docs/translate.py update`.

A message is written `_("... {name} ...").format(name=value)`: the catalog holds the text with
its placeholders, so a translation can put them where its grammar wants them.
"""
from __future__ import annotations

import gettext
from pathlib import Path

from .rundir import LANG_ENV, setting

LOCALE = Path(__file__).resolve().parent / "locale"
SETTING = LANG_ENV  # the setting's name, for the tests and docs/translate.py
CHINESE = ("zh", "zh_cn", "zh_hans")

_notebook_choice: str | None = None  # what the notebook chose with %fourcards_lang (see magic.py)


def _gettext_names(chosen: str) -> list[str]:
    return ["zh_CN" if name.strip().lower().replace("-", "_") in CHINESE else name.strip()
            for name in chosen.split(":")]


def choose(language: str | None) -> None:
    """The notebook's choice (`zh`, `en`; None: none), below FOURCARDS_LANG and above the locale."""
    global _notebook_choice
    _notebook_choice = language.strip() if language and language.strip() else None


def chosen() -> str | None:
    """FOURCARDS_LANG where it is set, else the notebook's choice; None: the locale decides."""
    return setting(LANG_ENV) or _notebook_choice


def languages() -> list[str] | None:
    """The languages asked for (FOURCARDS_LANG, then the notebook), in gettext's names; None: the locale decides."""
    choice = chosen()
    return _gettext_names(choice) if choice else None


def for_ranks() -> dict[str, str]:
    """What a launched rank's environment needs to speak as the notebook does: the notebook's
    choice as FOURCARDS_LANG, where the setting itself is not set (then the ranks inherit it)."""
    choice = chosen()
    return {SETTING: choice} if choice else {}


def _(message: str) -> str:
    """`message` in the learner's language. Read at each call, so that a choice made in a notebook
    takes effect at once; gettext keeps each catalog it has read. An empty message stays empty:
    gettext would return the catalog's header for it."""
    if not message:
        return message
    return gettext.translation("fourcard_helpers", LOCALE, languages=languages(), fallback=True).gettext(message)


FULL_WIDTH = "。！？；：，）」"  # Chinese punctuation, which carries its own space


def sentences(*parts: str) -> str:
    """Sentences one after another, as a message puts a hint after what went wrong: a space between
    them, as English writes it, but none after Chinese punctuation («崩溃。 可能的原因» is not Chinese)."""
    text = parts[0] if parts else ""
    for part in parts[1:]:
        text += ("" if text.endswith(tuple(FULL_WIDTH)) else " ") + part
    return text


def N_(message: str) -> str:
    """Marks a message kept in a constant for the catalog; `_()` translates it where it is used."""
    return message
