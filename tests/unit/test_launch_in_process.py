"""What the launcher decides before any rank starts: the ranks' environment, and a timeout refused."""
from __future__ import annotations

from pathlib import Path

import pytest

from fourcard_helpers.cards import detect
from fourcard_helpers.launch import LaunchError, rank_environment, torchrun
from fourcard_helpers.rundir import INIT_BARRIER_ENV


def test_init_ends_in_a_barrier_unless_the_learner_says_otherwise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without it, a rank of a script with no collective could exit while a slower one was still connecting to it
    (gloo: "Connection closed by peer"): 2 of 91 two-rank launches of init and destroy beside busy processes
    failed so, and none of 51 with the barrier."""
    monkeypatch.delenv(INIT_BARRIER_ENV, raising=False)
    assert rank_environment(detect(2), tmp_path, "job", None)[INIT_BARRIER_ENV] == "1"
    monkeypatch.setenv(INIT_BARRIER_ENV, "0")
    assert rank_environment(detect(2), tmp_path, "job", None)[INIT_BARRIER_ENV] == "0"


def test_timeout_must_be_positive() -> None:
    for timeout in (0, -5, float("nan")):
        with pytest.raises(LaunchError, match="timeout must be a positive number of seconds"):
            torchrun("print('never runs')", nproc=2, timeout=timeout)
