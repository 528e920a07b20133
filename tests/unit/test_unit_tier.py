"""The unit tier's promise, that none of its tests starts a process, is kept by its conftest's gates:
here they meet tests written to break it, in a pytest run inside this one (pytester), each of which
must fail, naming what it called; a test that starts nothing must pass. No process is started: a
gate raises before the call it guards goes anywhere."""
from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")
BREAKERS = {
    "test_popen": "import subprocess\n\ndef test_it():\n    subprocess.run(['true'])\n",
    "test_caught": ("import subprocess\n\ndef test_it():\n    try:\n        subprocess.run(['true'])\n"
                    "    except Exception:\n        pass  # the code under test hides the error: the test fails all the same\n"),
    "test_system": "import os\n\ndef test_it():\n    os.system('true')\n",
    "test_fork": "import multiprocessing\n\ndef test_it():\n    multiprocessing.get_context('fork').Process(target=print).start()\n",
    "test_thread": ("import subprocess, threading\n\ndef test_it():\n"
                   "    worker = threading.Thread(target=lambda: subprocess.run(['true']), name='not-background')\n"
                   "    worker.start()\n    worker.join()\n"),
    "test_fixture": ("import os, pytest\n\n@pytest.fixture\ndef started():\n    os.system('true')\n\n"
                     "def test_it(started):\n    pass\n"),
}


@pytest.fixture
def tier(pytester: pytest.Pytester) -> pytest.Pytester:
    """A folder whose conftest is the unit tier's, with tests/helpers.py beside it as the tier has it."""
    pytester.makeconftest(CONFTEST.read_text(encoding="utf-8"))
    pytester.syspathinsert(Path(__file__).resolve().parent.parent)
    return pytester


@pytest.mark.parametrize("name", sorted(BREAKERS))
def test_a_test_that_starts_a_process_fails_and_is_told_where_it_belongs(tier: pytest.Pytester, name: str) -> None:
    tier.makepyfile(**{name: BREAKERS[name]})
    result = tier.runpytest_inprocess("-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) == 0 and outcomes.get("failed", 0) + outcomes.get("errors", 0) >= 1, outcomes
    assert "tests/unit starts no process" in result.stdout.str()


def test_a_test_that_starts_nothing_passes(tier: pytest.Pytester) -> None:
    tier.makepyfile(test_quiet="import threading\n\ndef test_it():\n    threading.Thread(target=sum, args=([1],)).start()\n")
    tier.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
