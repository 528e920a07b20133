"""The launcher, tested with real torchrun launches of real scripts on gloo.

Only what a real launch proves is here (the explanation of each failure kind is tested from
run folders in test_diagnose.py). Every test checks the process table afterwards, with the
package's own `leftover_processes`: a launch must leave no torchrun and no rank behind,
whichever way it ended.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest
import torch

from fourcard_helpers.launch import LaunchError, leftover_processes, rank_pids, torchrun
from fourcard_helpers.lifecycle import wait_until
from fourcard_helpers.rundir import UNBUFFERED_ENV
from helpers import INIT, assert_nothing_left, plain_environment, plain_torchrun_command, script, start_kernel_like_launch


@pytest.mark.slow
def test_success_returns_every_ranks_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = script(tmp_path, """
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)
        print(f"rank {rank} sees {value.item():.0f}")
        report(rank=rank, total=value, world=dist.get_world_size())
        dist.destroy_process_group()
        print("四卡 ✓ no newline", end="")
    """)
    result = torchrun(path, nproc=4, timeout=300)
    assert sorted(result.reports) == [0, 1, 2, 3]
    assert result.values("rank") == [0, 1, 2, 3]
    assert result.values("total") == [[10.0]] * 4  # 1 + 2 + 3 + 4 on every rank
    assert result.values("world") == [4] * 4
    out = capsys.readouterr().out
    for rank in range(4):
        assert f"[rank{rank}] rank {rank} sees 10\n" in out  # whole lines, prefixed
        assert f"[rank{rank}] 四卡 ✓ no newline\n" in out  # a last line without newline still ends
    assert "4 simulated cards" in out
    assert_nothing_left()


def test_script_arguments_and_source_text(tmp_path: Path) -> None:
    source = INIT + "report(args=sys.argv[1:])\ndist.destroy_process_group()\n"
    result = torchrun(source, nproc=2, args=["--epochs", "3"], timeout=120, echo=False)
    assert result.values("args") == [["--epochs", "3"]] * 2


def test_raising_rank_is_named_with_its_traceback(tmp_path: Path) -> None:
    path = script(tmp_path, """
        print(f"rank {rank} splits the data", flush=True)
        def shard_size(n):
            if rank == 2:
                raise ValueError(f"cannot split {n} samples")
            return n // 4
        shard_size(10)
        dist.barrier()  # the other ranks wait here for rank 2, which never comes
        dist.destroy_process_group()
    """)
    with pytest.raises(LaunchError) as caught:  # the barrier would wait 30 minutes, past the timeout:
        torchrun(path, nproc=4, timeout=300, echo=False)  # only failing fast gives this error
    message = str(caught.value)
    assert caught.value.rank == 2
    assert message.startswith("rank 2 of 4 raised ValueError: cannot split 10 samples")
    assert "in shard_size" in message and 'raise ValueError(f"cannot split {n} samples")' in message
    assert "SIGTERM" not in message  # torchrun's own report is not what the learner sees
    assert "[rank2] rank 2 splits the data\n" in caught.value.log  # printed before it raised
    assert_nothing_left()


@pytest.mark.slow
def test_hang_past_timeout_kills_every_rank(tmp_path: Path) -> None:
    path = script(tmp_path, """
        if rank == 0:
            dist.barrier()  # waits forever: the others never call it
        time.sleep(600)
    """)
    with pytest.raises(LaunchError) as caught:
        torchrun(path, nproc=4, timeout=12, echo=False)
    message = str(caught.value)
    assert "timeout of 12 s" in message
    assert "[0, 1, 2, 3]" in message  # nobody finished (or even started): all are named as still running
    assert_nothing_left()


def test_abort_at_exit_is_reported_as_such(tmp_path: Path) -> None:
    path = script(tmp_path, """
        dist.barrier()
        if rank == 1:
            os.abort()  # what a C++ 'terminate called ...' at shutdown looks like from outside
        dist.destroy_process_group()
    """)
    with pytest.raises(LaunchError) as caught:
        torchrun(path, nproc=2, timeout=120, echo=False)
    assert caught.value.rank == 1
    assert "SIGABRT" in str(caught.value) and "destroy_process_group" in str(caught.value)
    assert_nothing_left()


def test_a_native_crash_is_blamed_not_the_ranks_it_took_down(tmp_path: Path) -> None:
    path = script(tmp_path, """
        dist.barrier()
        if rank == 1:
            os.abort()  # a C++ failure inside a rank: no Python exception, no except clause
        dist.all_reduce(torch.ones(1))  # the others fail when rank 1 is gone, with Python errors
        dist.destroy_process_group()
    """)
    with pytest.raises(LaunchError) as caught:
        torchrun(path, nproc=3, timeout=120, echo=False)
    message = str(caught.value)
    assert caught.value.rank == 1, message
    assert message.startswith("rank 1 of 3 crashed in native code (SIGABRT)")
    line = path.read_text().splitlines().index("    os.abort()  # a C++ failure inside a rank: no Python exception, no except clause") + 1
    assert f'job.py", line {line} in <module>' in message  # faulthandler's stack at the moment of the crash
    assert "worker.py" not in message
    assert_nothing_left()


@pytest.mark.slow
def test_two_launches_at_once(tmp_path: Path) -> None:
    results: dict[str, object] = {}

    def run(name: str) -> None:
        path = script(tmp_path, f"""
            value = torch.ones(1) * (rank + 1)
            dist.all_reduce(value)
            report(total=value.item(), name="{name}")
            dist.destroy_process_group()
        """, name=f"{name}.py")
        try:
            results[name] = torchrun(path, nproc=2, timeout=120, echo=False)
        except Exception as error:  # noqa: BLE001 - recorded and asserted below
            results[name] = error

    threads = [threading.Thread(target=run, args=(name,)) for name in ("first", "second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name in ("first", "second"):
        result = results[name]
        assert not isinstance(result, Exception), result
        assert result.values("total") == [3.0, 3.0] and result.values("name") == [name, name]
    assert_nothing_left()


@pytest.mark.slow
def test_interrupt_stops_every_rank(tmp_path: Path) -> None:
    kernel = start_kernel_like_launch(tmp_path)
    assert len(leftover_processes(kernel.pid)) >= 5  # torchrun and four ranks
    kernel.send_signal(signal.SIGINT)  # what the notebook's stop button sends the kernel
    rest, _ = kernel.communicate(timeout=120)
    assert kernel.returncode == 3, rest
    assert "all 4 ranks stopped" in rest
    assert_nothing_left(kernel.pid)


@pytest.mark.slow
def test_killed_kernel_leaves_no_rank(tmp_path: Path) -> None:
    kernel = start_kernel_like_launch(tmp_path)
    assert len(leftover_processes(kernel.pid)) >= 5
    os.kill(kernel.pid, signal.SIGKILL)  # a kernel that dies gets no chance to clean up
    kernel.wait()
    assert_nothing_left(kernel.pid)


def test_launch_from_a_thread_that_ends_first(tmp_path: Path) -> None:
    """The launch outlives the thread that started it (PR_SET_PDEATHSIG set by that thread
    would have killed torchrun as the thread ended)."""
    path = script(tmp_path, """
        dist.barrier()
        report(rank=rank)
        dist.destroy_process_group()
    """)
    outcome: list[object] = []
    starter = threading.Thread(target=lambda: outcome.append(torchrun(path, nproc=2, timeout=300, echo=False)))
    starter.start()
    starter.join()
    assert outcome[0].values("rank") == [0, 1]
    assert_nothing_left()


@pytest.mark.slow
def test_rank_pids_finds_each_rank_of_a_running_launch(tmp_path: Path) -> None:
    """While ranks wait, rank_pids() maps each global rank to its own process (what lesson 12's
    py-spy and SIGUSR1 need), and lists no torchrun agent; after the launch it is empty."""
    go = tmp_path / "go"
    path = script(tmp_path, f"""
        report(pid=os.getpid())
        while not os.path.exists({str(go)!r}):
            time.sleep(0.05)
        dist.barrier()
        dist.destroy_process_group()
    """)
    seen: list[dict[int, int]] = []

    def watch() -> None:
        try:
            wait_until(lambda: len(rank_pids()) >= 3, 120)  # the bound only ends a launch that never starts
        finally:
            seen.append(rank_pids())
            go.touch()

    watcher = threading.Thread(target=watch)
    watcher.start()
    result = torchrun(path, nproc=3, timeout=300, echo=False)
    watcher.join()
    assert seen[0] == {rank: result.reports[rank]["pid"] for rank in range(3)}
    assert rank_pids() == {}
    assert_nothing_left()


EXIT_LIKE_A_TERMINAL = """
import atexit, os, sys
folder, rank = sys.argv[1], os.environ["RANK"]
def goodbye():
    with open(os.path.join(folder, f"atexit.{rank}"), "w") as out:
        out.write("exit handlers ran")
atexit.register(goodbye)
log = open(os.path.join(folder, f"unclosed.{rank}"), "w")  # buffered, and never closed
log.write("what a rank left in its buffer")
"""


@pytest.mark.slow
def test_a_script_ends_as_it_would_in_a_terminal(tmp_path: Path) -> None:
    path = tmp_path / "ending.py"
    path.write_text(EXIT_LIKE_A_TERMINAL)
    (tmp_path / "plain").mkdir()
    (tmp_path / "launcher").mkdir()
    subprocess.run(plain_torchrun_command(["--standalone", "--nproc-per-node=2"], path, str(tmp_path / "plain")),
                   check=True, env=plain_environment(), capture_output=True)
    torchrun(path, nproc=2, args=[str(tmp_path / "launcher")], timeout=300, echo=False)

    def files(folder: str) -> dict[str, str]:
        return {p.name: p.read_text() for p in sorted((tmp_path / folder).iterdir())}

    assert files("plain")["unclosed.1"] == "what a rank left in its buffer"
    assert files("plain")["atexit.1"] == "exit handlers ran"
    assert files("launcher") == files("plain")
    assert_nothing_left()


GPU_SCRIPT = """
import os, torch, torch.distributed as dist
local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("nccl")  # as PyTorch's own DDP tutorial scripts are written
torch.cuda.set_device(local_rank)
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="simulated cards only")
def test_a_gpu_script_on_simulated_cards_says_what_to_change(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as caught:
        torchrun(GPU_SCRIPT, nproc=2, timeout=300, echo=False)
    message = str(caught.value)
    assert "raised RuntimeError: Distributed package doesn't have NCCL built in" in message
    assert "cards.backend" in message and "cards.device(local_rank)" in message and "four GPUs" in message
    assert_nothing_left()


ENDS_WITH_OS_EXIT = INIT + """
from torch.utils.data import DataLoader
code = int(sys.argv[1])
batches = list(DataLoader(torch.arange(8.0), batch_size=2, num_workers=2))  # forked workers end with os._exit too
total = torch.tensor([float(sum(b.sum() for b in batches))])
dist.all_reduce(total)
report(total=total)
print(f"rank {rank}: total {total.item():.0f}, not flushed yet", end="")  # left in stdout's buffer
dist.destroy_process_group()
sys.stdout.flush(); os._exit(code)
"""


@pytest.mark.slow
@pytest.mark.parametrize("code", [0, 3])
def test_a_script_that_ends_with_os_exit_ends_the_same_way_in_both_launchers(tmp_path: Path, code: int) -> None:
    """The shipped scripts end with exit_without_teardown(), an os._exit (lesson 00): under plain torchrun and under the course's
    launcher, which takes the script's own os._exit as its end, the exit code and the flushed output
    are the same."""
    path = tmp_path / "ending.py"
    path.write_text(ENDS_WITH_OS_EXIT)
    plain = subprocess.run(plain_torchrun_command(["--standalone", "--nproc-per-node=2"], path, str(code)),
                           env=plain_environment(**{UNBUFFERED_ENV: "0"}), capture_output=True, text=True)
    for rank in (0, 1):
        assert f"rank {rank}: total 56, not flushed yet" in plain.stdout
    if code == 0:
        assert plain.returncode == 0, plain.stderr[-2000:]
        result = torchrun(path, nproc=2, args=[str(code)], timeout=300, echo=False)
        assert result.values("total") == [[56.0], [56.0]]
        assert [line for line in result.log.splitlines() if "not flushed" in line] == [
            f"[rank{rank}] rank {rank}: total 56, not flushed yet" for rank in (0, 1)]
    else:
        assert plain.returncode != 0 and "exitcode  : 3" in plain.stdout + plain.stderr
        with pytest.raises(LaunchError) as caught:
            torchrun(path, nproc=2, args=[str(code)], timeout=300, echo=False)
        assert f"exited with code {code} (os._exit({code}))" in str(caught.value)
    assert_nothing_left()


LEAVES_ITS_BUFFERS = INIT + """
folder = sys.argv[1]
log = open(os.path.join(folder, f"unflushed.{rank}"), "w")  # never flushed, never closed
log.write("held in the file's buffer")
dist.destroy_process_group()
os._exit(0)  # no flush first: what the buffers hold is dropped, in a terminal as in a cell
"""


@pytest.mark.slow
def test_after_a_scripts_own_os_exit_nothing_is_flushed_in_either_launcher(tmp_path: Path) -> None:
    """Lesson 00: a saved script ends the same way in a cell and in a terminal. After the script's own
    os._exit the course's launcher waits for nothing and flushes nothing, as plain torchrun's rank does
    (print() is the one difference the lesson names: the launcher's ranks write it unbuffered)."""
    path = tmp_path / "buffers.py"
    path.write_text(LEAVES_ITS_BUFFERS)
    (tmp_path / "plain").mkdir()
    (tmp_path / "launcher").mkdir()
    plain = subprocess.run(plain_torchrun_command(["--standalone", "--nproc-per-node=2"], path, str(tmp_path / "plain")),
                           env=plain_environment(), capture_output=True, text=True)
    assert plain.returncode == 0, plain.stderr[-2000:]
    torchrun(path, nproc=2, args=[str(tmp_path / "launcher")], timeout=300, echo=False)
    for folder in ("plain", "launcher"):
        assert {p.name: p.read_text() for p in sorted((tmp_path / folder).iterdir())} == {"unflushed.0": "", "unflushed.1": ""}
    assert_nothing_left()
