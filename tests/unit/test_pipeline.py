"""Pipeline schedules of lesson 07: orders, logical timeline, bubble and memory."""
from fractions import Fraction

import pytest

from helpers import ROOT, written_by_cells

from fourcard_helpers.schedules import idle_fraction, peak_in_flight, pipeline_order, simulate_pipeline


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
@pytest.mark.parametrize("stages,micro_batches", [(1, 1), (2, 3), (4, 1), (4, 8), (5, 16)])
def test_every_op_once_and_bubble_matches_formula(schedule, stages, micro_batches):
    orders = pipeline_order(schedule, stages, micro_batches)
    everything = sorted([(op, i) for op in "FB" for i in range(micro_batches)])
    assert all(sorted(ops) == everything for ops in orders)
    events = simulate_pipeline(orders, Fraction(1), Fraction(2))
    assert idle_fraction(events) == Fraction(stages - 1, micro_batches + stages - 1)


def test_peak_activations_gpipe_m_1f1b_at_most_stages():
    for s, ops in enumerate(pipeline_order("GPipe", 4, 16)):
        assert peak_in_flight(ops) == 16
    assert [peak_in_flight(ops) for ops in pipeline_order("1F1B", 4, 16)] == [4, 3, 2, 1]
    assert [peak_in_flight(ops) for ops in pipeline_order("1F1B", 4, 2)] == [2, 2, 2, 1]


def test_deadlocking_orders_and_bad_names_are_refused():
    with pytest.raises(ValueError, match="deadlock"):
        simulate_pipeline([[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]])
    with pytest.raises(ValueError, match="unknown schedule"):
        pipeline_order("zero-bubble", 4, 4)


def test_idle_fraction_of_measured_style_events():
    events = [("card 0", 0.0, 1.0, "forward"), ("card 1", 1.0, 2.0, "forward")]
    assert idle_fraction(events) == 0.5


NOTEBOOK = ROOT / "notebooks" / "07_model_and_pipeline_parallel.ipynb"


def test_the_step_module_the_scripts_import_is_the_lessons_cell():
    """scripts/pipeline_step.py is written by %%writefile cells of lesson 07: the shipped file must be those cells."""
    shipped = NOTEBOOK.parent / "scripts" / "pipeline_step.py"
    assert shipped.read_text(encoding="utf-8") == written_by_cells(NOTEBOOK, "scripts/pipeline_step.py")
