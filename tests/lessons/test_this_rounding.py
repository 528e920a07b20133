"""The longest lessons' strict nbval, in this machine's rounding, run in the background lane.

CI is bound by CPU work on two cores, and its critical path is the suite's own lane: its tests and the nbval
of every lesson, one after another, take about 39 minutes alone on a 2-core AMD EPYC with AVX-512 (measured in
parts: the process and lesson tests alone, 20 minutes; nbval alone, at the end of a whole run, 18), while the
background lane (every lesson under another rounding, then the scripts launched plain) ended well before it
(tests/lessons/conftest.py). So when this module is selected, as in a run of the whole suite, these lessons'
nbval runs in the background lane instead, once its other jobs are done, each in a pytest of its own in a copy
of the notebooks folder, exactly as `pytest notebooks/NN.ipynb` runs it (the same options from pyproject.toml,
the same environment as the suite's); the suite's own nbval leaves them out, and each test here gives its
lesson's verdict. Run by itself (`pytest notebooks/`), nbval runs every lesson as always.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers import NOTEBOOK_DIR

# The longest lessons under nbval alone (seconds, the AVX-512 machine above): 13 (103; 89 once 13b was split from it),
# 14 (89), 11 (78), 09 (70).
IN_THE_BACKGROUND = [NOTEBOOK_DIR / f"{stem}.ipynb" for stem in
                     ("11_capstone", "13_gpt_on_four_cards", "14_long_sequences_and_experts", "09_memory_and_sharding")]


@pytest.mark.slow
@pytest.mark.parametrize("notebook", IN_THE_BACKGROUND, ids=lambda path: path.stem)
def test_the_notebook_passes_strict_nbval(notebook: Path, under_this_rounding: Any) -> None:
    done = under_this_rounding  # the lesson's run, started in the background when collection ended
    assert done.returncode == 0, f"{notebook.name} under strict nbval:\n{done.output[-4000:]}"
