"""The run folder contract and `report()`, without a launch."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fourcard_helpers.rundir import ERROR, REPORT, RUN_DIR_ENV, RunDir
from fourcard_helpers.reporting import report


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
    monkeypatch.setenv("RANK", "2")
    report(loss=torch.tensor(0.5), grads=torch.ones(2, requires_grad=True) * 2, n=np.int64(3),
           dtype=torch.float32, device=torch.device("cpu"), path=Path("a/b.pt"), shape=(1, 2), np_dtype=np.dtype("f4"))
    report(step=1)
    assert RunDir(tmp_path).read_json_lines(REPORT) == {2: [
        {"loss": 0.5, "grads": [2.0, 2.0], "n": 3, "dtype": "torch.float32", "device": "cpu",
         "path": "a/b.pt", "shape": [1, 2], "np_dtype": "float32"},
        {"step": 1}]}


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
    monkeypatch.setenv("RANK", "1")
    report(total=torch.tensor([10.0]))
    assert capsys.readouterr().out == 'report from rank 1: {"total": [10.0]}\n'


def test_a_refused_report_is_blamed_on_the_script_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The traceback a failing rank leaves shows the script's frames, not report()'s insides."""
    from fourcard_helpers import worker

    script = tmp_path / "job.py"
    script.write_text("from fourcard_helpers import report\nreport(thing=object())\n")
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    try:
        exec(compile(script.read_text(), str(script), "exec"), {"__name__": "__main__"})
    except TypeError as error:
        record = worker._error_record(error, 0, 0.0)
    assert 'job.py", line 2, in <module>' in record["traceback"]
    assert "worker.py" not in record["traceback"] and record["type"] == "TypeError"
