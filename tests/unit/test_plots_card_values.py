"""plots.card_values: one panel per moment, one row per card, None for 'nothing meaningful'."""
import matplotlib

matplotlib.use("Agg")

from fourcard_helpers import plots  # noqa: E402


def test_card_values_draws_every_number():
    before = [[0, 1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]]
    after = [[60, 64, 68, 72], None, None, None]
    fig = plots.card_values([("before", before), ("after reduce", after)], title="reduce to card 0")
    left, right = fig.axes
    assert len(left.patches) == 16 and len(right.patches) == 4
    assert {t.get_text() for t in right.texts} == {"60", "64", "68", "72", "unspecified"}
    assert [t.get_text() for t in left.get_yticklabels()] == ["card 0", "card 1", "card 2", "card 3"]
    fig.savefig(__import__("io").BytesIO(), format="png")


def test_every_helper_leaves_its_figure_open_as_plt_subplots_does():
    """One rule for all: the notebook shows each figure once, at the end of its cell."""
    import matplotlib.pyplot as plt
    import torch

    figures = [plots.show_digits(torch.zeros(2, 28, 28), [0, 1]),
               plots.timeline([("card 0", 0.0, 1.0, "compute")]),
               plots.card_values([("before", [[1.0], [2.0]])])]
    assert all(plt.fignum_exists(fig.number) for fig in figures)
    plt.close("all")
