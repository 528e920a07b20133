"""The launcher, tested with real torchrun launches of real scripts on gloo.

Every test checks the process table afterwards: a launch must leave no torchrun and no
rank behind, whichever way it ended. Scripts live in a per-test folder, so the process
search only sees this test's processes even when other launches run on the machine.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from fourcard_helpers.launch import LaunchError, torchrun


INIT = """
import os, sys, time
import torch
import torch.distributed as dist
from fourcard_helpers import detect, report
cards = detect(int(os.environ["WORLD_SIZE"]))
dist.init_process_group(cards.backend)
rank = dist.get_rank()
"""


def script(tmp_path: Path, body: str, name: str = "job.py") -> Path:
    path = tmp_path / name
    path.write_text(INIT + textwrap.dedent(body))
    return path


def processes_mentioning(token: str) -> list[str]:
    """Live (non-zombie) processes whose command line contains `token`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token in cmdline and state != "Z":
            found.append(f"{entry.name}: {cmdline}")
    return found


def assert_nothing_left(tmp_path: Path) -> None:
    deadline = time.monotonic() + 5
    while processes_mentioning(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_mentioning(str(tmp_path)) == []


def test_success_returns_every_ranks_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = script(tmp_path, """
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)
        print(f"rank {rank} sees {value.item():.0f}")
        report(rank=rank, total=value, world=dist.get_world_size())
        dist.destroy_process_group()
    """)
    result = torchrun(path, nproc=4, timeout=120)
    assert result.returncode == 0
    assert sorted(result.reports) == [0, 1, 2, 3]
    assert result.values("rank") == [0, 1, 2, 3]
    assert result.values("total") == [[10.0]] * 4  # 1 + 2 + 3 + 4 on every rank
    assert result.values("world") == [4] * 4
    out = capsys.readouterr().out
    for rank in range(4):
        assert f"[rank{rank}] rank {rank} sees 10\n" in out  # whole lines, prefixed
    assert "4 simulated cards" in out
    assert_nothing_left(tmp_path)


def test_script_arguments_and_source_text(tmp_path: Path) -> None:
    source = INIT + "report(args=sys.argv[1:])\ndist.destroy_process_group()\n"
    result = torchrun(source, nproc=2, args=["--epochs", "3"], timeout=120, echo=False)
    assert result.values("args") == [["--epochs", "3"]] * 2


def test_raising_rank_is_named_with_its_traceback(tmp_path: Path) -> None:
    path = script(tmp_path, """
        def shard_size(n):
            if rank == 2:
                raise ValueError(f"cannot split {n} samples")
            return n // 4
        shard_size(10)
        dist.barrier()  # the other ranks wait here for rank 2, which never comes
        dist.destroy_process_group()
    """)
    started = time.monotonic()
    with pytest.raises(LaunchError) as caught:
        torchrun(path, nproc=4, timeout=120, echo=False)
    message = str(caught.value)
    assert caught.value.rank == 2
    assert message.startswith("rank 2 of 4 raised ValueError: cannot split 10 samples")
    assert "in shard_size" in message and 'raise ValueError(f"cannot split {n} samples")' in message
    assert "SIGTERM" not in message  # torchrun's own report is not what the learner sees
    assert time.monotonic() - started < 60  # fails fast: nobody waits for the barrier's timeout
    assert_nothing_left(tmp_path)


def test_hang_past_timeout_kills_every_rank(tmp_path: Path) -> None:
    path = script(tmp_path, """
        if rank == 0:
            report(done=True)
            print("rank 0 skips the barrier", flush=True)
        else:
            dist.barrier()  # waits forever for rank 0
        time.sleep(600)
    """)
    with pytest.raises(LaunchError) as caught:
        torchrun(path, nproc=4, timeout=12, echo=False)
    message = str(caught.value)
    assert "timeout of 12 s" in message
    assert "[0, 1, 2, 3]" in message  # nobody finished: every rank is named as still running
    assert "rank 0 skips the barrier" in caught.value.log
    assert_nothing_left(tmp_path)


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
    assert_nothing_left(tmp_path)


def test_a_native_crash_is_blamed_not_the_ranks_it_took_down(tmp_path: Path) -> None:
    path = script(tmp_path, """
        dist.barrier()
        if rank == 1:
            os.abort()  # a C++ failure inside a rank: no Python exception, no except clause
        time.sleep(1)
        dist.all_reduce(torch.ones(1))  # the others now fail to reach rank 1, with Python errors
        dist.destroy_process_group()
    """)
    with pytest.raises(LaunchError) as caught:
        torchrun(path, nproc=3, timeout=120, echo=False)
    message = str(caught.value)
    assert caught.value.rank == 1, message
    assert message.startswith("rank 1 of 3 crashed in native code (SIGABRT)")
    assert 'job.py", line 12 in <module>' in message  # faulthandler's stack at the moment of the crash
    assert "worker.py" not in message
    assert_nothing_left(tmp_path)


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
    assert_nothing_left(tmp_path)


KERNEL = """
import sys
from fourcard_helpers.launch import torchrun
try:
    torchrun(sys.argv[1], nproc=4, timeout=300)
except KeyboardInterrupt:
    print("KeyboardInterrupt reached the caller", flush=True)
    sys.exit(3)
"""


def start_kernel_like_launch(tmp_path: Path) -> subprocess.Popen[str]:
    """A Python process standing in for the notebook kernel, launching 4 ranks that sleep."""
    path = script(tmp_path, """
        print("ready", flush=True)
        time.sleep(600)
    """)
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL, str(path)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    assert kernel.stdout is not None
    ready = 0
    for line in kernel.stdout:
        ready += line.endswith("] ready\n")
        if ready == 4:
            return kernel
    pytest.fail("the ranks never started")


def test_interrupt_stops_every_rank(tmp_path: Path) -> None:
    kernel = start_kernel_like_launch(tmp_path)
    assert len(processes_mentioning(str(tmp_path))) >= 5  # torchrun and four ranks
    kernel.send_signal(signal.SIGINT)  # what the notebook's stop button sends the kernel
    rest, _ = kernel.communicate(timeout=30)
    assert kernel.returncode == 3, rest
    assert "all 4 ranks stopped" in rest
    assert_nothing_left(tmp_path)


def test_killed_kernel_leaves_no_rank(tmp_path: Path) -> None:
    kernel = start_kernel_like_launch(tmp_path)
    os.kill(kernel.pid, signal.SIGKILL)  # a kernel that dies gets no chance to clean up
    kernel.wait(timeout=10)
    assert_nothing_left(tmp_path)
