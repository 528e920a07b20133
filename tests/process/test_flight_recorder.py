"""What lesson 12 says of PyTorch's flight recorder in torch 2.13, checked: it is on by default (for gloo
too) and keeps each rank's last 2,000 collectives; TORCH_FR_BUFFER_SIZE=N keeps the last N, and 0 none."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fourcard_helpers.launch import torchrun

CALLS = 2100  # more than the default keeps

SCRIPT = textwrap.dedent(f"""
    import pickle

    import torch
    import torch.distributed as dist
    from fourcard_helpers import exit_without_teardown, report
    dist.init_process_group("gloo")
    x = torch.ones(1)
    for _ in range({CALLS}):
        dist.all_reduce(x)
    record = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    report(seq=[entry["collective_seq_id"] for entry in record.get("entries", [])])
    dist.destroy_process_group()
    exit_without_teardown()
""")


@pytest.mark.slow
@pytest.mark.parametrize("size, kept", [(None, 2000), ("5", 5), ("0", 0)])
def test_the_flight_recorder_keeps_the_last_n_collectives(tmp_path: Path, size: str | None, kept: int) -> None:
    path = tmp_path / "record.py"
    path.write_text(SCRIPT)
    env = {"TORCH_FR_BUFFER_SIZE": size} if size is not None else None
    result = torchrun(path, nproc=2, env=env, echo=False, doctor=False, timeout=300)
    for rank in range(2):
        assert result.reports[rank]["seq"] == list(range(CALLS - kept + 1, CALLS + 1)), (rank, size)
