"""Figures the lessons share. Each returns its matplotlib Figure and keeps PNGs small.

Every helper leaves its figure open, as `plt.subplots` does: a notebook shows it once, at the
end of the cell, after any changes the cell makes to it. So do not also make the call the
cell's last value (that would show it a second time): assign it (`fig = plots.timeline(...)`)
or end the line with `;`.

The words a helper writes itself (a card's name, a timeline's kinds) come in the learner's language
(language.py). Chinese text needs a font that has its glyphs, which matplotlib's own DejaVu Sans has
not: the course installs noto-cjk-sans-otc, which ships Noto Sans CJK on disk (nothing is
downloaded), and importing this module adds Noto Sans CJK SC behind matplotlib's default font, for
the glyphs that font lacks; Latin text is drawn as before.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib import font_manager
from matplotlib.figure import Figure

from .language import N_, _

DPI = 80  # stored notebooks carry their figures; 80 dpi keeps each PNG in the tens of KB
CARD_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")
CJK_FAMILY = "Noto Sans CJK SC"  # Simplified Chinese forms, from the collection's faces (matplotlib reads each)
# The kinds of work the lessons' timelines show (lesson 07's pipeline operations, schedules.py's, and the
# gaps between them; lesson 06's all-reduce beside the backward pass): marked for the catalog, so that
# timeline() names them in the learner's language.
PIPELINE_KINDS = (N_("forward"), N_("backward"), N_("idle"), N_("all-reduce"))


def use_cjk_font() -> bool:
    """Add Noto Sans CJK SC as the fallback for glyphs the default font lacks; False where the font's
    package (noto-cjk-sans-otc, a dependency) or matplotlib 3.11 (the first to read each face of a
    .ttc) is missing from an environment made some other way, and nothing changes."""
    try:
        import noto_cjk_sans_otc
    except ImportError:
        return False
    if CJK_FAMILY not in {font.name for font in font_manager.fontManager.ttflist}:
        font_manager.fontManager.addfont(str(noto_cjk_sans_otc.FONT_PATH))
    if CJK_FAMILY not in {font.name for font in font_manager.fontManager.ttflist}:
        return False
    families = list(plt.rcParams["font.family"])
    if CJK_FAMILY not in families:
        plt.rcParams["font.family"] = families + [CJK_FAMILY]
    return True


use_cjk_font()


def show_digits(images: torch.Tensor, labels: Sequence[int], predictions: Sequence[int] | None = None,
                columns: int = 8, title: str | None = None) -> Figure:
    """A grid of digits with their labels (and predictions, red where wrong)."""
    count = len(images)
    rows = (count + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(columns * 0.9, rows * 1.05), dpi=DPI, squeeze=False)
    for index, ax in enumerate(axes.flat):
        ax.axis("off")
        if index >= count:
            continue
        ax.imshow(images[index].reshape(28, 28).cpu(), cmap="gray_r")
        text, colour = f"{int(labels[index])}", "black"
        if predictions is not None:
            text += f" → {int(predictions[index])}"
            colour = "black" if int(predictions[index]) == int(labels[index]) else "red"
        ax.set_title(text, fontsize=9, color=colour)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def timeline(events: Iterable[tuple[str, float, float, str]], title: str = "", xlabel: str = "time",
             colours: dict[str, str] | None = None) -> Figure:
    """A Gantt chart: one row per lane (a card, a loader...), one bar per (lane, start, end, kind).

    Lanes are drawn top to bottom in the order they first appear; kinds get a legend. A lane or kind
    the package's catalog holds (PIPELINE_KINDS) is shown in the learner's language.
    """
    events = list(events)
    lanes = list(dict.fromkeys(lane for lane, *_ in events))
    kinds = list(dict.fromkeys(kind for *_, kind in events))
    palette = {kind: CARD_COLOURS[i % len(CARD_COLOURS)] for i, kind in enumerate(kinds)}
    palette.update(colours or {})
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(lanes) + 1.2), dpi=DPI)
    for lane, start, end, kind in events:
        ax.barh(lanes.index(lane), end - start, left=start, color=palette[kind], edgecolor="white", height=0.7)
    ax.set_yticks(range(len(lanes)), [_(lane) for lane in lanes])
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    handles = [plt.Rectangle((0, 0), 1, 1, color=palette[kind]) for kind in kinds]
    # Beside the chart, not under it: below, it collides with the x label for some lane counts.
    ax.legend(handles, [_(kind) for kind in kinds], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def card_values(panels: Sequence[tuple[str, Sequence[Sequence[float] | None]]], title: str = "",
                fmt: str = "{:g}") -> Figure:
    """What each card holds, side by side for several moments (e.g. before and after a collective).

    `panels` is a list of (label, rows) with one row of numbers per card; a row of None means
    the card holds nothing meaningful there (e.g. a non-root rank after `reduce`). Seeing the
    numbers move between cards is the quickest way to learn what each collective does.
    """
    panels = list(panels)
    width = max([len(row) for _, rows in panels for row in rows if row] or [1])
    cards = max(len(rows) for _, rows in panels)
    sizes = [max([len(row) for row in rows if row] or [width]) for _, rows in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(0.42 * s + 0.9 for s in sizes), 0.36 * cards + 0.7),
                             dpi=DPI, squeeze=False, gridspec_kw={"width_ratios": [s + 1.5 for s in sizes]})
    for ax, (label, rows), size in zip(axes.flat, panels, sizes):
        for card, row in enumerate(rows):
            colour = CARD_COLOURS[card % len(CARD_COLOURS)]
            if row is None:
                ax.text((size - 1) / 2, card, _("unspecified"), ha="center", va="center", fontsize=8, color="grey")
                continue
            for column, value in enumerate(row):
                ax.add_patch(plt.Rectangle((column - 0.45, card - 0.4), 0.9, 0.8, facecolor=colour, alpha=0.3))
                ax.text(column, card, fmt.format(value), ha="center", va="center", fontsize=8)
        ax.set_xlim(-0.55, size - 0.45)
        ax.set_ylim(cards - 0.5, -0.5)
        ax.set_xticks([])
        ax.set_yticks(range(cards), [_("card {card}").format(card=card) for card in range(cards)], fontsize=8)
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.set_title(label, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
