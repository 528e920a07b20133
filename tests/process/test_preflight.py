"""The pre-flight check, run as an instructor would (`python -m fourcard_helpers.preflight`),
with each value of FOURCARDS_DEVICE, on this machine's real cards and a real four-rank launch."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from fourcard_helpers.launch import leftover_processes
from fourcard_helpers.rundir import DEVICE_ENV, RENAMED

HAS_FOUR_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 4


def preflight(device: str | None) -> tuple[int, list[str]]:
    env = {key: value for key, value in os.environ.items() if key not in (DEVICE_ENV, RENAMED[DEVICE_ENV])}
    if device is not None:
        env[DEVICE_ENV] = device
    done = subprocess.run([sys.executable, "-m", "fourcard_helpers.preflight"], env=env, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout.splitlines()


@pytest.mark.slow
def test_simulated_cards_are_ready_after_a_real_launch() -> None:
    code, lines = preflight("cpu")
    assert code == 0, "\n".join(lines)
    assert lines[-1] == "READY ON SIMULATED CARDS: 4 CPU processes over gloo (FOURCARDS_DEVICE=cpu)."
    assert any(line.startswith("✓ a real 4-rank torchrun launch ran in") for line in lines)
    measured = [line for line in lines if line.startswith("✓ all-reduce of")]
    assert measured and "bus bandwidth" in measured[0]
    assert any("published, " in line for line in lines)  # compared with the lessons' figures
    assert not any(line.startswith("✗") for line in lines)
    assert leftover_processes() == []


@pytest.mark.slow
@pytest.mark.skipif(HAS_FOUR_GPUS, reason="auto picks the GPUs on this machine")
def test_auto_without_four_gpus_picks_simulated_cards_and_says_why() -> None:
    code, lines = preflight(None)
    assert code == 0 and lines[-1].startswith("READY ON SIMULATED CARDS: 4 CPU processes over gloo (")
    assert "GPU" in lines[-1]  # "no GPU found" or "only N GPUs found for 4 ranks"


@pytest.mark.skipif(HAS_FOUR_GPUS, reason="this machine has the GPUs asked for")
def test_insisting_on_gpus_without_them_is_not_ready_with_the_fix() -> None:
    code, lines = preflight("cuda")
    assert code == 1
    assert lines[-1].startswith("NOT READY: ") and "FOURCARDS_DEVICE=cpu" in lines[-1]
    assert not any("torchrun launch" in line for line in lines)  # nothing is launched on cards that do not exist


def test_a_misspelt_device_is_not_ready_with_the_fix() -> None:
    code, lines = preflight("gpu")
    assert code == 1
    assert lines[-1].startswith("NOT READY: FOURCARDS_DEVICE='gpu' is not understood: use one of auto, cpu, cuda")
