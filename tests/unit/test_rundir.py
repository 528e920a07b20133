"""The run folder contract and `report()`, without a launch."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from fourcard_helpers import rundir
from fourcard_helpers.rundir import CELL, ERROR, PREFIX, RANK_ENV, REPORT, RUN_DIR_ENV, ReportReader, RunDir
from fourcard_helpers.reporting import report
from helpers import SCRIPT_VARIABLES

PACKAGE = Path(rundir.__file__).resolve().parent
REPOSITORY = PACKAGE.parent


def test_records_are_named_by_kind_and_rank(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.write_json(ERROR, 3, {"type": "ValueError"})
    run.write_json(ERROR, 1, {"type": "KeyError"})
    assert run.file(ERROR, 3) == tmp_path / "error.3"
    assert list(run.ranks(ERROR)) == [1, 3]
    assert run.read_json(ERROR) == {1: {"type": "KeyError"}, 3: {"type": "ValueError"}}
    assert run.ranks(REPORT) == {}
    with pytest.raises(ValueError, match="unknown record kind 'errors'"):
        run.file("errors", 0)


def test_an_atomic_write_leaves_no_partial_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = RunDir(tmp_path)
    run.write(ERROR, 0, "first")
    run.write(ERROR, 0, "second")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["error.0"]
    (tmp_path / "error.0.partial").write_text("half a rec")  # what a reader could meet mid-write
    assert run.read_text(ERROR) == {0: "second"}

    def write_half_then_die(self: Path, text: str, encoding: str | None = None) -> int:  # a rank killed mid-write
        with open(self, "w", encoding=encoding) as out:
            out.write(text[: len(text) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", write_half_then_die)
    with pytest.raises(KeyboardInterrupt):
        run.write(ERROR, 0, "a third record")
    monkeypatch.undo()
    assert run.read_text(ERROR) == {0: "second"}  # the reader still sees the whole earlier record


def test_report_sends_json_lines_per_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(RANK_ENV, "2")
    reader = ReportReader(RunDir(tmp_path))
    report(loss=torch.tensor(0.5), grads=torch.ones(2, requires_grad=True) * 2, n=np.int64(3),
           dtype=torch.float32, device=torch.device("cpu"), path=Path("a/b.pt"), shape=(1, 2), np_dtype=np.dtype("f4"))
    first = {"loss": 0.5, "grads": [2.0, 2.0], "n": 3, "dtype": "torch.float32", "device": "cpu",
             "path": "a/b.pt", "shape": [1, 2], "np_dtype": "float32"}
    assert [(rank, json.loads(line)) for rank, line in reader.take()] == [(2, first)]
    report(step=1, loss=0.25)
    with open(RunDir(tmp_path).file(REPORT, 2), "a", encoding="utf-8") as out:
        out.write('{"half": ')  # a line being written: not taken yet
    assert [rank for rank, _line in reader.take()] == [2] and reader.take() == []  # each line taken once
    assert reader.values == {2: {**first, "step": 1, "loss": 0.25}}  # a later value replaces the earlier one


def test_report_refuses_values_that_would_arrive_as_meaningless_text(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    with pytest.raises(TypeError, match=r"report\(model\[0\]=...\) got a value of type torch.nn.modules.linear.Linear"):
        report(model=[torch.nn.Linear(2, 2)])
    with pytest.raises(TypeError, match=r"builtins.object.*pass str\(...\)"):
        report(thing=object())
    assert RunDir(tmp_path).ranks(REPORT) == {}  # nothing half-sent


def test_report_prints_outside_the_launcher(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    monkeypatch.setenv(RANK_ENV, "1")
    report(total=torch.tensor([10.0]))
    assert capsys.readouterr().out == 'report from rank 1: {"total": [10.0]}\n'


def test_a_refused_report_is_blamed_on_the_script_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The traceback a failing rank leaves shows the script's frames, not report()'s insides."""
    from fourcard_helpers import worker

    script = tmp_path / "job.py"
    script.write_text("from fourcard_helpers import report\nreport(thing=object())\n")
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(RANK_ENV, "0")
    try:
        exec(compile(script.read_text(), str(script), "exec"), {"__name__": "__main__"})
    except TypeError as error:
        record = worker._error_record(error, 0, 0.0)
    assert 'job.py", line 2, in <module>' in record["traceback"]
    assert "worker.py" not in record["traceback"] and record["type"] == "TypeError"


def test_the_launchs_own_files_are_named_by_the_contract(tmp_path: Path) -> None:
    assert RunDir(tmp_path).part(CELL) == tmp_path / "cell.py"
    with pytest.raises(ValueError, match="unknown record kind 'notes.txt'"):
        RunDir(tmp_path).part("notes.txt")


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string in the code of `path`: docstrings left out, f-strings' own parts included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_every_variable_of_the_course_is_named_in_rundir_alone_under_one_prefix() -> None:
    names = {value for name, value in vars(rundir).items() if name.endswith("_ENV") and value.startswith("FOURCARD")}
    assert names and all(name.startswith(PREFIX) for name in names)
    # each new name under the one prefix; each old one under the old prefix, or the one that had none
    assert all(new.startswith(PREFIX) and (old.startswith("FOURCARD_") or old == "MNIST_FULL")
               for new, old in rundir.RENAMED.items())
    every_name = {value for name, value in vars(rundir).items() if name.endswith("_ENV")} | set(rundir.RENAMED.values())
    spelled = [f"{path.relative_to(PACKAGE)}:{line}: {text!r}" for path in sorted(PACKAGE.rglob("*.py"))
               if path.name != "rundir.py" for line, text in _code_strings(path)
               if re.search(r"FOURCARDS?_[A-Z]", text) or text in every_name]  # ours in any string; others' alone
    assert spelled == [], "import the name from fourcard_helpers.rundir:\n" + "\n".join(spelled)


def _tests_and_benchmarks() -> list[Path]:
    """The Python files of tests/ and benchmarks/, this guard's own file left out (it spells what it looks for)."""
    return [path for folder in (REPOSITORY / "tests", REPOSITORY / "benchmarks") for path in sorted(folder.rglob("*.py"))
            if path.resolve() != Path(__file__).resolve()]


def test_tests_and_benchmarks_import_the_course_variables_names() -> None:
    """Where a test or a benchmark means a variable of the course, or one it sets for torch or Python, it takes the
    name from rundir: no string is the name alone, or a script's text that reads it from the environment. A
    sentence a learner reads that names a variable is the message's text, and torchrun's own variables are what
    a rank script reads (helpers.SCRIPT_VARIABLES)."""
    every_name = {value for name, value in vars(rundir).items() if name.endswith("_ENV")} | set(rundir.RENAMED.values())
    spelled = [f"{path.relative_to(REPOSITORY)}:{line}: {text!r}" for path in _tests_and_benchmarks()
               for line, text in _code_strings(path) if _spells_a_name(text, every_name - SCRIPT_VARIABLES)]
    assert spelled == [], "import the name from fourcard_helpers.rundir:\n" + "\n".join(spelled)
    # and the guard sees what it is for: a bare name, and a name a rank script in a test's string reads
    names = every_name - SCRIPT_VARIABLES
    assert _spells_a_name("FOURCARDS_LANG", names) and _spells_a_name("FOURCARD_DEVICE", names)
    assert _spells_a_name('\n    own = os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE")\n', names)
    assert _spells_a_name("env = {'OMP_NUM_THREADS': '1'}", names) is False  # a dict's key in a longer text: data
    assert not _spells_a_name("set FOURCARDS_DEVICE=cpu to use simulated cards", names)  # a learner's message


def _spells_a_name(text: str, names: set[str]) -> bool:
    """Whether a string is a variable's name alone (ours: FOURCARDS_/FOURCARD_ anything), or a script's text that
    reads one of `names` from the environment: `environ[NAME]`, `environ.get(NAME`, `getenv(NAME`."""
    if text in names or re.fullmatch(r"FOURCARDS?_[A-Z_]+", text):
        return True
    read = re.findall(r"(?:environ\[|environ\.get\(|getenv\()\s*['\"]([A-Z_]+)['\"]", text)
    return any(name in names or name.startswith("FOURCARD") for name in read)


def test_the_process_table_is_read_in_lifecycle_alone() -> None:
    """The package, its tests and benchmarks read /proc through lifecycle alone. (The lessons that teach what
    /proc shows read it in their own cells and scripts, as lifecycle's docstring says.)"""
    files = [path for path in sorted(PACKAGE.rglob("*.py")) if path.name != "lifecycle.py"] + _tests_and_benchmarks()
    readers = [f"{path.relative_to(REPOSITORY)}:{line}: {text!r}" for path in files
               for line, text in _code_strings(path) if re.search(r"/proc\b", text)]
    assert readers == [], "ask fourcard_helpers.lifecycle:\n" + "\n".join(readers)
    assert re.search(r"/proc\b", "/proc/1/environ") and not re.search(r"/proc\b", "tests/process")
