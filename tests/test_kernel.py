"""A launch inside a real Jupyter kernel: the stop button and a kernel restart end every rank.

These drive an ipykernel through jupyter_client, as JupyterLab does, and look for survivors
in the process table by the marker the launcher gives its processes (the kernel's pid).
"""
from __future__ import annotations

import queue
import time
from typing import Iterator

import pytest
from jupyter_client import KernelManager

from fourcard_helpers.launch import leftover_processes

CELL = """%%torchrun -n 4 --timeout 300
import time
print("ready", flush=True)
time.sleep(300)
"""


def wait_until(condition, seconds: float = 120) -> bool:
    """Wait for `condition` (an event, such as the last rank ending); `seconds` only bounds a
    failure, far beyond the few seconds stopping takes."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


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


def test_stop_button_ends_every_rank(kernel: tuple[KernelManager, object]) -> None:
    manager, client = kernel
    msg_id, kernel_pid = start_launch(client)
    assert len(leftover_processes(kernel_pid)) >= 5  # torchrun and four ranks are running
    manager.interrupt_kernel()  # what the notebook's stop button does
    reply = client.get_shell_msg(timeout=120)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    assert wait_until(lambda: leftover_processes(kernel_pid) == []), leftover_processes(kernel_pid)
    assert client.execute_interactive("1 + 1", timeout=60)["content"]["status"] == "ok"  # the kernel lives on


def test_kernel_restart_ends_every_rank(kernel: tuple[KernelManager, object]) -> None:
    manager, client = kernel
    _, kernel_pid = start_launch(client)
    manager.restart_kernel(now=True)  # the kernel is killed outright: no Python code of ours runs
    assert wait_until(lambda: leftover_processes(kernel_pid) == []), leftover_processes(kernel_pid)
