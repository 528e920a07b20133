"""A launch inside a real Jupyter kernel: the stop button and a kernel restart end every rank.

These drive an ipykernel through jupyter_client, as JupyterLab does, and look for survivors
in the process table by the marker the launcher gives its processes (the kernel's pid).
"""
from __future__ import annotations

import os
import queue
import signal
import time
from typing import Iterator

import pytest
from jupyter_client import KernelManager

from fourcard_helpers.launch import leftover_processes
from helpers import wait_for

pytestmark = pytest.mark.slow  # every test here starts ranks, a kernel or a browser: left out by `-m "not slow"`

CELL = """%%torchrun -n 4 --timeout 300
import time
print("ready", flush=True)
time.sleep(300)
"""


@pytest.fixture
def kernel() -> Iterator[tuple[KernelManager, object]]:
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    client.execute_interactive("%load_ext fourcard_helpers", timeout=60)
    yield manager, client
    client.stop_channels()
    if manager.is_alive():
        manager.shutdown_kernel(now=True)


def start_launch(client: object) -> tuple[str, int]:
    """Run the sleeping 4-rank cell; return its message id and the kernel's pid once all
    four ranks have said 'ready'."""
    outputs: list[dict] = []
    client.execute_interactive("import os; print(os.getpid())", timeout=60, output_hook=outputs.append)
    kernel_pid = int(next(m["content"]["text"] for m in outputs if m["msg_type"] == "stream"))
    msg_id = client.execute(CELL)
    ready = 0
    deadline = time.monotonic() + 300  # bounds a failure only; the loop ends at the fourth 'ready'
    while ready < 4 and time.monotonic() < deadline:
        try:
            msg = client.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if msg["msg_type"] == "stream" and msg["parent_header"].get("msg_id") == msg_id:
            ready += msg["content"]["text"].count("] ready")
    assert ready == 4, "the ranks never started"
    return msg_id, kernel_pid


def execute_after_an_error(client, code: str) -> dict:
    """`execute_interactive` right after a cell failed. ipykernel 7 answers 'aborted', without running it, a
    request that reaches it before it has finished aborting the failed cell's queue; send it again then."""
    for _ in range(10):
        reply = client.execute_interactive(code, timeout=60)
        if reply["content"]["status"] != "aborted":
            return reply
    raise AssertionError(f"the kernel aborted {code!r} ten times in a row")


def test_stop_button_ends_every_rank(kernel: tuple[KernelManager, object]) -> None:
    manager, client = kernel
    msg_id, kernel_pid = start_launch(client)
    assert len(leftover_processes(kernel_pid)) >= 5  # torchrun and four ranks are running
    manager.interrupt_kernel()  # what the notebook's stop button does
    reply = client.get_shell_msg(timeout=120)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    assert wait_for(lambda: leftover_processes(kernel_pid) == []), leftover_processes(kernel_pid)
    assert execute_after_an_error(client, "1 + 1")["content"]["status"] == "ok"  # the kernel lives on


def test_kernel_restart_ends_every_rank(kernel: tuple[KernelManager, object]) -> None:
    manager, client = kernel
    _, kernel_pid = start_launch(client)
    manager.restart_kernel(now=True)  # the kernel is killed outright: no Python code of ours runs
    assert wait_for(lambda: leftover_processes(kernel_pid) == []), leftover_processes(kernel_pid)


# -- the warm session (%ranks) in a real kernel ------------------------------------------------
def start_ranks(client: object, tmp_path) -> tuple[str, int]:
    """Start a 2-rank warm session and a cell that sleeps on both ranks; return its message id
    and the kernel's pid once both ranks have begun the cell (each touches a file)."""
    outputs: list[dict] = []
    client.execute_interactive("import os; print(os.getpid())", timeout=60, output_hook=outputs.append)
    kernel_pid = int(next(m["content"]["text"] for m in outputs if m["msg_type"] == "stream"))
    reply = client.execute_interactive("%ranks start -n 2 --timeout 600", timeout=600)
    assert reply["content"]["status"] == "ok", reply["content"]
    assert len(leftover_processes(kernel_pid)) >= 4  # controller, torchrun and two ranks
    msg_id = client.execute(f"%%ranks\nimport pathlib, time\npathlib.Path(r'{tmp_path}', str(rank)).touch()\n"
                            "time.sleep(600)\n")
    assert wait_for(lambda: all((tmp_path / str(rank)).exists() for rank in (0, 1)), 120), "the cell never began"
    return msg_id, kernel_pid


def test_ranks_magics_run_a_cell_pull_and_stop(kernel: tuple[KernelManager, object]) -> None:
    _, client = kernel
    outputs: list[dict] = []
    client.execute_interactive("import os; print(os.getpid())", timeout=60, output_hook=outputs.append)
    kernel_pid = int(next(m["content"]["text"] for m in outputs if m["msg_type"] == "stream"))
    assert client.execute_interactive("%ranks start -n 2 --timeout 600", timeout=600)["content"]["status"] == "ok"
    outputs.clear()
    client.execute_interactive("%%ranks\nx = torch.tensor([rank + 1.0])\ndist.all_reduce(x)\nprint('sum', x.item())",
                               timeout=120, output_hook=outputs.append)
    text = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
    assert text == "[rank0] sum 3.0\n[rank1] sum 3.0\n"  # grouped and in rank order
    outputs.clear()
    client.execute_interactive("xs = %ranks pull x\nprint([x.item() for x in xs])", timeout=120,
                               output_hook=outputs.append)
    assert "[3.0, 3.0]" in "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
    outputs.clear()  # report() inside a cell reaches the notebook: shown with its rank, kept for %ranks reports
    client.execute_interactive("%%ranks\nfrom fourcard_helpers import report\nreport(total=x)", timeout=120,
                               output_hook=outputs.append)
    client.execute_interactive("reports = %ranks reports\nprint(reports)", timeout=120, output_hook=outputs.append)
    text = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
    assert text == ('[rank0] report: {"total": [3.0]}\n[rank1] report: {"total": [3.0]}\n'
                    "[{'total': [3.0]}, {'total': [3.0]}]\n")
    assert client.execute_interactive("%ranks stop", timeout=120)["content"]["status"] == "ok"
    assert leftover_processes(kernel_pid) == []


def test_stop_button_in_a_ranks_cell_ends_the_session(kernel: tuple[KernelManager, object], tmp_path) -> None:
    manager, client = kernel
    msg_id, kernel_pid = start_ranks(client, tmp_path)
    manager.interrupt_kernel()
    reply = client.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    assert wait_for(lambda: leftover_processes(kernel_pid) == []), leftover_processes(kernel_pid)
    reply = execute_after_an_error(client, "%%ranks\nrank")  # says the session has ended
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "RankSessionError"


def test_kernel_restart_ends_the_ranks_session(kernel: tuple[KernelManager, object], tmp_path) -> None:
    manager, client = kernel
    _, kernel_pid = start_ranks(client, tmp_path)
    manager.restart_kernel(now=True)
    assert wait_for(lambda: leftover_processes(kernel_pid) == []), leftover_processes(kernel_pid)


def test_killed_kernel_leaves_no_ranks_session(kernel: tuple[KernelManager, object], tmp_path) -> None:
    _, client = kernel
    _, kernel_pid = start_ranks(client, tmp_path)
    os.kill(kernel_pid, signal.SIGKILL)  # no code of ours runs in the kernel: each root sees its pipe close
    assert wait_for(lambda: leftover_processes(kernel_pid) == []), leftover_processes(kernel_pid)
