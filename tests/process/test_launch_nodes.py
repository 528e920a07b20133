"""Several torchrun agents on one machine, one per "node", joined into one world by torchrun's
c10d rendezvous: the launcher's promises (results by global rank, the failing rank named with
its traceback, nothing left behind) hold across agents. Real torchrun, real gloo."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from fourcard_helpers.launch import LaunchError, leftover_processes, torchrun
from fourcard_helpers.rundir import OWN_STORE_ENV
from helpers import assert_nothing_left, script, start_kernel_like_launch

pytestmark = pytest.mark.slow  # every test here starts ranks, a kernel or a browser: left out by `-m "not slow"`


def test_two_agents_form_one_world(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = script(tmp_path, """
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)
        print(f"rank {rank} sees {value.item():.0f}")
        report(rank=rank, world=dist.get_world_size(), total=value.item(), pid=os.getppid(),
               **{name: int(os.environ[name]) for name in ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE")})
        dist.destroy_process_group()
    """)
    result = torchrun(path, nproc=2, nnodes=2, timeout=300)
    assert result.nproc == 4 and result.values("world") == [4] * 4
    assert result.values("total") == [10.0] * 4  # one all-reduce spans both agents
    assert result.values("RANK") == [0, 1, 2, 3]
    assert result.values("LOCAL_RANK") == [0, 1, 0, 1] and result.values("LOCAL_WORLD_SIZE") == [2] * 4
    assert result.values("GROUP_RANK") == [0, 0, 1, 1]  # RANK = GROUP_RANK * 2 + LOCAL_RANK
    agents = result.values("pid")  # each rank's parent: the torchrun agent of its node
    assert agents[0] == agents[1] != agents[2] == agents[3]
    out = capsys.readouterr().out
    assert "4 ranks (2 nodes × 2, one torchrun agent each)" in out
    for rank in range(4):
        assert f"[rank{rank}] rank {rank} sees 10\n" in out
    assert_nothing_left()


def test_a_rank_raising_on_the_second_node_is_named_and_both_nodes_stop(tmp_path: Path) -> None:
    path = script(tmp_path, """
        if os.environ["GROUP_RANK"] == "1" and os.environ["LOCAL_RANK"] == "1":
            raise ValueError("node 1 has no data")
        dist.barrier()  # the other three wait here, on both nodes, for a rank that never comes
        dist.destroy_process_group()
    """)
    with pytest.raises(LaunchError) as caught:  # only failing fast ends the barrier before the timeout
        torchrun(path, nproc=2, nnodes=2, timeout=300, echo=False)
    message = str(caught.value)
    assert caught.value.rank == 3
    assert message.startswith("rank 3 of 4 raised ValueError: node 1 has no data")
    assert 'raise ValueError("node 1 has no data")' in message
    assert_nothing_left()


def test_a_rank_killed_on_one_node_stops_the_other_node(tmp_path: Path) -> None:
    path = script(tmp_path, """
        dist.barrier()
        if rank == 2:
            os.kill(os.getpid(), 9)  # SIGKILL: no Python error, only its agent sees it go
        dist.barrier()  # the others wait here for a rank that is gone
        dist.destroy_process_group()
    """)
    with pytest.raises(LaunchError) as caught:
        torchrun(path, nproc=2, nnodes=2, timeout=300, echo=False)
    assert caught.value.rank == 2 and "killed by SIGKILL" in str(caught.value)
    assert_nothing_left()


def test_timeout_stops_both_nodes(tmp_path: Path) -> None:
    path = script(tmp_path, """
        if rank == 3:
            dist.barrier()  # waits forever: the others never call it
        time.sleep(600)
    """)
    with pytest.raises(LaunchError, match="timeout of 12 s"):
        torchrun(path, nproc=2, nnodes=2, timeout=12, echo=False)
    assert_nothing_left()


KERNEL = """
import signal
import sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as ipykernel does while a cell runs: a
# process started with SIGINT ignored (a background job of a shell) would otherwise ignore the stop button
from fourcard_helpers.launch import torchrun
torchrun(sys.argv[1], nproc=2, nnodes=2, timeout=300)
"""


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["interrupt", "killed kernel"])
def test_interrupted_or_killed_kernel_leaves_no_agent_and_no_rank(tmp_path: Path, how: signal.Signals) -> None:
    kernel = start_kernel_like_launch(tmp_path, KERNEL)
    assert len(leftover_processes(kernel.pid)) >= 6  # two agents and four ranks
    os.kill(kernel.pid, how)
    rest = kernel.communicate(timeout=120)[0]
    if how == signal.SIGINT:
        assert "all 4 ranks stopped" in rest
    assert_nothing_left(kernel.pid)


def test_an_elastic_restart_after_a_killed_rank_succeeds(tmp_path: Path) -> None:
    path = script(tmp_path, f"""
        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        dist.barrier()
        if rank == 1 and attempt == 0:
            os.kill(os.getpid(), 9)  # SIGKILL on the first attempt only
        dist.barrier()
        report(attempt=attempt, own_store=os.environ.get("{OWN_STORE_ENV}"))
        dist.destroy_process_group()
    """)
    result = torchrun(path, nproc=2, max_restarts=1, timeout=300, echo=False)
    assert result.values("attempt") == [1, 1]  # torchrun restarted both ranks, and the second attempt passed
    assert result.values("own_store") == ["1", "1"]  # each attempt's ranks get a store of their own (launch.py)
    assert_nothing_left()
