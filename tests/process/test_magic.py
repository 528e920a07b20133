"""The %%torchrun cell magic in a real IPython shell, with a real 2-rank launch."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

from fourcard_helpers.launch import LaunchResult
from helpers import shell  # noqa: F401  (a fixture: the shell with the course's magics loaded)

CELL = """import sys, torch.distributed as dist
from fourcard_helpers import report
dist.init_process_group("gloo")
report(rank=dist.get_rank(), args=sys.argv[1:])
dist.destroy_process_group()
"""


def test_magic_runs_the_cell_saves_it_and_stores_the_result(shell: InteractiveShell, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = shell.run_cell_magic("torchrun", "-n 2 --timeout 120 --save scripts/job.py --result run -- --lr 0.1", CELL)
    assert isinstance(result, LaunchResult)
    assert shell.user_ns["run"] is result
    assert result.values("rank") == [0, 1]
    assert result.values("args") == [["--lr", "0.1"], ["--lr", "0.1"]]
    assert (tmp_path / "scripts" / "job.py").read_text() == CELL  # runnable later from a terminal


def test_nnodes_starts_one_agent_per_node(shell: InteractiveShell) -> None:
    cell = CELL.replace("args=sys.argv[1:]", "node=int(__import__('os').environ['GROUP_RANK'])")
    result = shell.run_cell_magic("torchrun", "-n 1 --nnodes 2 --timeout 120", cell)
    assert result.values("rank") == [0, 1] and result.values("node") == [0, 1]


def test_failed_launch_shows_the_ranks_error_without_kernel_frames(shell: InteractiveShell,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    outcome = shell.run_cell("%%torchrun -n 2 --timeout 120\nimport os\nif os.environ['RANK'] == '1':\n    1 / 0\n")
    assert outcome.error_in_exec is not None and type(outcome.error_in_exec).__name__ == "LaunchError"
    shown = capsys.readouterr()
    text = shown.out + shown.err
    assert "rank 1 of 2 raised ZeroDivisionError: division by zero" in text
    assert 'File "cell.py", line 3' in text
    assert "launch.py" not in text and "interactiveshell.py" not in text
    assert sys.last_value is outcome.error_in_exec  # the next cell can inspect the error


def test_an_exercise_skeleton_is_saved_but_not_launched(shell: InteractiveShell, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    shell.user_ns["run"] = "an earlier run"
    skeleton = CELL.replace("report(", "raise NotImplementedError  # your code here\nreport(")
    result = shell.run_cell_magic("torchrun", "-n 2 --timeout 120 --save scripts/job.py --result run", skeleton)
    assert result is None and "run" not in shell.user_ns  # nothing launched, and no stale result to check
    # the cell's line: the %%torchrun line is the cell's first, the script's first line its second
    assert "not launched: line 5 of this cell still says `raise NotImplementedError`" in capsys.readouterr().out
    assert (tmp_path / "scripts" / "job.py").read_text() == skeleton
    written = skeleton.replace("raise NotImplementedError  # your code here\n", "")   # the learner's part done
    done = shell.run_cell_magic("torchrun", "-n 2 --timeout 120 --result run", written)
    assert isinstance(done, LaunchResult) and shell.user_ns["run"] is done and done.values("rank") == [0, 1]


def test_a_failed_launch_leaves_no_earlier_result_to_judge(
        shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    shell.user_ns["run"] = "an earlier run"
    outcome = shell.run_cell("%%torchrun -n 2 --timeout 120 --result run\nraise SystemExit(3)\n")
    assert outcome.error_in_exec is not None and "run" not in shell.user_ns
    capsys.readouterr()
    # An exercise's check that finds no result says so: the learner has attempted it, the launch failed.
    shell.run_cell("from fourcard_helpers import check\n"
                   "def judge(result):\n    if result is None:\n        raise check.NotLaunched\n"
                   "check.exercise('the launch', lambda: judge(globals().get('run')))")
    shown = capsys.readouterr().out
    assert "no successful launch yet" in shown and "not attempted" not in shown
