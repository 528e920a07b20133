"""The cell magics where no rank is launched, in a real IPython shell: a skeleton told from a deliberate error, and
%%solution cells, which run the reference solution in the kernel's own process."""
from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

from helpers import shell  # noqa: F401  (a fixture: the shell with the course's magics loaded)


def test_a_deliberate_error_with_a_message_is_not_a_skeleton() -> None:
    from fourcard_helpers.magic import placeholder_line
    assert placeholder_line("x = 1\nraise NotImplementedError\n") == 2
    assert placeholder_line("def f():\n    raise NotImplementedError()\n") == 2
    assert placeholder_line("if gpu:\n    raise NotImplementedError('no GPU here')\n") is None
    assert placeholder_line("raise NotImplementedError(\n") is None  # does not parse: launched, to show the error
    assert placeholder_line("class Base:\n    def forward(self):\n        raise NotImplementedError\n") is None  # abstract
    assert placeholder_line("def main():\n    if x:\n        raise NotImplementedError\nraise NotImplementedError\n") == 3


def test_solution_checks_the_reference_without_touching_the_learners_names(
        shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    shell.run_cell("from fourcard_helpers import check\n"
                   "def double(x):\n    raise NotImplementedError\n"
                   "check.exercise('double', lambda: check.equal(double(2), 4))")
    assert "not attempted" in capsys.readouterr().out
    outcome = shell.run_cell("%%solution\ndef double(x):\n    return 2 * x\n"
                             "helper = 1\ncheck.exercise('double', lambda: check.equal(double(2), 4))")
    assert outcome.success
    assert "reference solution passes" in capsys.readouterr().out
    with pytest.raises(NotImplementedError):  # the learner's stub is still theirs
        shell.user_ns["double"](2)
    assert "helper" not in shell.user_ns


def test_a_solution_shows_its_verdict_and_hides_what_it_prints(
        shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    """Run All stores every output: a solution's own prints would give the answer away."""
    outcome = shell.run_cell("%%solution\nfrom fourcard_helpers import check\nprint('the answer is 63')\n"
                             "check.exercise('steps', lambda: check.equal(63, 63))")
    shown = capsys.readouterr().out
    assert outcome.success and "reference solution passes" in shown and "63" not in shown
    failed = shell.run_cell("%%solution\nfrom fourcard_helpers import check\nprint('the answer is 62')\n"
                            "check.exercise('steps', lambda: check.equal(62, 63))")
    assert type(failed.error_in_exec).__name__ == "CheckFailed"
    assert "the answer is 62" in capsys.readouterr().out  # a failing solution shows everything, to be fixed


def test_a_wrong_reference_solution_fails_the_cell(shell: InteractiveShell) -> None:
    outcome = shell.run_cell("%%solution\nfrom fourcard_helpers import check\n"
                             "check.exercise('triple', lambda: check.equal(2 * 3, 7))")
    assert type(outcome.error_in_exec).__name__ == "CheckFailed"
    stub = shell.run_cell("%%solution\nfrom fourcard_helpers import check\n"
                          "def f():\n    raise NotImplementedError\ncheck.exercise('f', f)")
    assert isinstance(stub.error_in_exec, NotImplementedError)  # a solution must be complete


def test_a_solutions_functions_keep_their_source(shell: InteractiveShell) -> None:
    """A check may copy a solution's function into a four-rank script: inspect must find its source."""
    outcome = shell.run_cell("%%solution\nimport inspect\nfrom fourcard_helpers import check\n"
                             "def halve(x):\n    return x / 2\n"
                             "check.exercise('halve', lambda: check.equal(inspect.getsource(halve),"
                             " 'def halve(x):\\n    return x / 2\\n'))")
    assert outcome.success, outcome.error_in_exec
