"""The doctor's verdicts from the ranks' records, and its own faults, without a launch."""
from __future__ import annotations

import pytest

from fourcard_helpers.doctor import examine


@pytest.mark.parametrize("nproc", [1, 2])
def test_examine_needs_every_rank(nproc: int) -> None:
    record = {"steps": 3, "joined_group": False, "used_ddp": False, "collectives_while_training": 0,
              "collectives_at_end": 0, "weights": [{"shapes": [[1]], "in_ddp": False, "values": [[1.0]]}],
              "sampler_epochs": [], "padded_evaluations": [], "saved_paths": [], "first_batches": []}
    assert examine({0: record}, nproc) == []  # one rank, or a rank missing: nothing to compare


def test_a_fault_of_the_doctor_never_breaks_the_script() -> None:
    import torch

    from fourcard_helpers.doctor import Observer

    observer = Observer()
    observer.ddp_parameters = None  # type: ignore[assignment] - a stand-in for any bug of the doctor's own
    model = torch.nn.Linear(3, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    observer._after_step(optimizer, (), {})  # would raise without the guard
    assert observer.broken and observer.record() == {"broken": True}
    healthy = {"steps": 1, "joined_group": False, "used_ddp": False, "collectives_while_training": 0,
               "collectives_at_end": 0, "weights": [], "sampler_epochs": [], "padded_evaluations": [],
               "saved_paths": [], "first_batches": []}
    assert examine({0: healthy, 1: {"broken": True}}, 2) == []  # a rank that stopped watching: no verdict
