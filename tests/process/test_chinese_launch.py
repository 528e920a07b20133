"""The Chinese edition where another process is involved: the Chinese notebooks that a second pytest collects
for nbval, and a real failed launch explained in Chinese (the rest: tests/unit/test_chinese.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from fourcard_helpers.rundir import LANG_ENV
from helpers import CHINESE_NBVAL, ROOT


@pytest.mark.slow  # a second pytest collects every notebook: 14 s
def test_nbval_runs_the_chosen_chinese_notebooks_again_and_no_other() -> None:
    """Their code is the English with its text translated (checked in tests/unit/test_chinese.py and
    tests/lessons/test_chinese_notebooks.py): nbval runs only the lessons conftest.py names, for CI's time."""
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "notebooks"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    assert "00_cards_and_launching.ipynb::" in collected.stdout
    chinese = {line.split("::")[0] for line in collected.stdout.splitlines() if line.startswith("notebooks/zh/")}
    assert chinese == {f"notebooks/zh/{name}.ipynb" for name in CHINESE_NBVAL}


@pytest.mark.slow
def test_a_real_failed_launch_explains_itself_in_chinese(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through torchrun and the kernel-side launcher, as a learner with FOURCARDS_LANG=zh meets it."""
    from fourcard_helpers.diagnose import LaunchError
    from fourcard_helpers.launch import leftover_processes, torchrun

    monkeypatch.setenv(LANG_ENV, "zh")
    script = "import torch.distributed as dist\nprint(dist.get_rank())\n"
    with pytest.raises(LaunchError) as failed:
        torchrun(script, nproc=2, timeout=120, echo=False)
    text = str(failed.value)
    assert "（共 2 个）抛出了 ValueError" in text or "（共 2 个）抛出了 RuntimeError" in text, text
    assert "这个 rank 在加入进程组之前就用了 torch.distributed" in text and "其余 rank 已被停止" in text
    assert leftover_processes() == []
