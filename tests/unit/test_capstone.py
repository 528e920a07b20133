"""Lesson 11's measuring instruments: the module its launches import is the lesson's own cell, and it counts."""
import importlib.util

import pytest
import torch
import torch.distributed as dist
from fourcard_helpers.lifecycle import free_ports
from helpers import ROOT, written_by_cells

NOTEBOOKS = ROOT / "notebooks"
SHIPPED = NOTEBOOKS / "scripts" / "comm_meter.py"


def test_the_module_the_launches_import_is_the_lessons_cell():
    """scripts/comm_meter.py is written by %%writefile cells of lesson 11: the shipped file must be those cells."""
    assert SHIPPED.read_text(encoding="utf-8") == written_by_cells(NOTEBOOKS / "11_capstone.ipynb", "scripts/comm_meter.py")


@pytest.fixture()
def one_rank_group():
    """A real gloo process group of one rank, on 127.0.0.1."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_ports(1)[0]}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_count_bytes_counts_messages_and_their_size_not_barriers(one_rank_group):
    spec = importlib.util.spec_from_file_location("comm_meter", SHIPPED)
    comm_meter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(comm_meter)
    counter = comm_meter.CountBytes()
    with counter:
        dist.all_reduce(torch.ones(1000))                     # 4,000 bytes
        dist.broadcast(torch.ones(10, dtype=torch.float64), 0)  # 80 bytes
        dist.barrier()                                         # not a message
    assert (counter.bytes, counter.calls) == (4080, 2)
    assert counter.reset() == (4080, 2)  # reset hands back what it counted: the lesson's warm-up steps
    assert (counter.bytes, counter.calls) == (0, 0)
    dist.all_reduce(torch.ones(5))  # outside the `with`: not seen
    assert counter.calls == 0
