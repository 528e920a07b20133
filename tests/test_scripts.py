"""Every script a lesson saves runs unchanged with plain `torchrun`, as the lessons promise.

The notebook's `%%torchrun` adds live output and results, nothing a script depends on: here
each shipped script runs under a bare `python -m torch.distributed.run --standalone`, with no
arguments, from the notebooks folder (where the kernel runs it), on simulated cards. A script
whose cell is a staged failure (tagged `raises-exception`) must fail here too, by itself and
within its cell's timeout.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from test_notebooks import NOTEBOOKS, cells, source

NOTEBOOK_DIR = NOTEBOOKS[0].parent


def shipped_launches() -> list[tuple[str, int, float, bool]]:
    """(script path relative to notebooks/, ranks, timeout, expected to fail) of every saved launch."""
    found = []
    for path in NOTEBOOKS:
        for cell in cells(path):
            text = source(cell)
            if cell["cell_type"] != "code" or not text.startswith("%%torchrun"):
                continue
            line = text.partition("\n")[0]
            saved = re.search(r"--save\s+(\S+)", line)
            if not saved:
                continue
            nproc = re.search(r"(?:-n|--nproc)\s+(\d+)", line)
            timeout = re.search(r"--timeout\s+([\d.]+)", line)
            fails = "raises-exception" in cell["metadata"].get("tags", [])
            found.append((saved.group(1), int(nproc.group(1)) if nproc else 4,
                          float(timeout.group(1)) if timeout else 300.0, fails))
    return found


@pytest.mark.parametrize("script, nproc, timeout, fails", shipped_launches(), ids=lambda v: str(v))
def test_script_runs_with_plain_torchrun(script: str, nproc: int, timeout: float, fails: bool) -> None:
    env = {**os.environ, "FOURCARD_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONUNBUFFERED": "1"}
    env.pop("FOURCARD_RUN_DIR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", script],
        cwd=NOTEBOOK_DIR, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout + 60)  # the script's own timeout, with a margin
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{script} did not end within {timeout + 60:g} s:\n{output.decode()[-3000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # nothing of the run may outlive the test
        except ProcessLookupError:
            pass
    text = output.decode("utf-8", "replace")
    if fails:
        assert proc.returncode != 0, f"{script} is a staged failure but succeeded:\n{text[-3000:]}"
    else:
        assert proc.returncode == 0, f"{script} failed under plain torchrun:\n{text[-3000:]}"
