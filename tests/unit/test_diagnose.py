"""Every failure kind the launcher explains, from a run folder as the ranks and agent leave it.

No launch here: each test writes the records of one failure through the same RunDir the
ranks use, and checks what `diagnose` makes of them. The error texts are what PyTorch
printed for the real cause (captured from real launches on simulated cards).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fourcard_helpers.diagnose import Ending, LaunchError, diagnose, hint_for
from fourcard_helpers.rundir import CRASH, DONE, ERROR, EXIT, REPORT, RunDir

FAILED = Ending(returncode=1, output="torchrun's own summary, never parsed")


@pytest.fixture
def run(tmp_path: Path) -> RunDir:
    return RunDir(tmp_path)


def raised(run: RunDir, rank: int, kind: str, message: str, at: float, line: str = "x = f()") -> None:
    run.write_json(ERROR, rank, {
        "rank": rank, "time": at, "type": kind, "message": message,
        "traceback": f'Traceback (most recent call last):\n  File "cell.py", line 7, in <module>\n    {line}\n{kind}: {message}\n'})


def exited(run: RunDir, rank: int, code: int, signal: str | None = None) -> None:
    run.write_json(EXIT, rank, {"exitcode": code, "signal": signal})


def crashed(run: RunDir, rank: int, mtime: float, fault: str = "Aborted") -> None:
    run.write(CRASH, rank, (f"Fatal Python error: {fault}\n\nCurrent thread 0x1 (most recent call first):\n"
                            '  File "job.py", line 12 in <module>\n'
                            '  File "/x/fourcard_helpers/worker.py", line 170 in main\n'
                            '  File "<frozen runpy>", line 88 in _run_code\n\nExtension modules: torch._C\n'))
    os.utime(run.file(CRASH, rank), (mtime, mtime))


def test_success_is_no_error(run: RunDir) -> None:
    run.append_json(REPORT, 0, {"loss": 0.5})
    for rank in range(4):
        run.write(DONE, rank, "")
        run.write(CRASH, rank, "")  # every rank opens its crash file; empty means no crash
    assert diagnose(run, 4, "", Ending(0)) is None


def test_first_raising_rank_is_blamed_with_its_traceback(run: RunDir) -> None:
    raised(run, 1, "RuntimeError", "Connection closed by peer", at=105.0)  # followed from rank 3
    raised(run, 3, "RuntimeError", "shape '[16, 1, 28, 28]' is invalid for input of size 9408", at=100.0)
    exited(run, 3, 1)
    exited(run, 0, -15, "SIGTERM")  # torchrun stopped the others
    error = diagnose(run, 4, "[rank3] loading\n", FAILED)
    assert error.rank == 3
    text = str(error)
    assert text.startswith("rank 3 of 4 raised RuntimeError: shape '[16, 1, 28, 28]' is invalid")
    assert 'File "cell.py", line 7' in text
    assert text.endswith("The other ranks were stopped. Fix the error above (it happened on rank 3; "
                         "errors on other ranks, if any, followed from it).")
    assert error.log == "[rank3] loading\n"
    assert "summary" not in text  # torchrun's prose is not shown when the ranks said more


def test_native_crash_before_the_errors_it_caused(run: RunDir) -> None:
    crashed(run, 1, mtime=100.0)
    raised(run, 0, "RuntimeError", "Connection closed by peer", at=100.2)
    raised(run, 2, "RuntimeError", "Connection closed by peer", at=100.3)
    exited(run, 1, -6, "SIGABRT")
    error = diagnose(run, 3, "[rank1] about to crash\n", FAILED)
    text = str(error)
    assert error.rank == 1
    assert text.startswith("rank 1 of 3 crashed in native code (SIGABRT)")
    assert "destroy_process_group(), then exit_without_teardown()" in text  # SIGABRT's hint
    assert 'job.py", line 12 in <module>' in text and "[rank1] about to crash" in text
    assert "worker.py" not in text and "Extension modules" not in text


def test_crash_signal_read_from_faulthandler_when_no_exit_record(run: RunDir) -> None:
    crashed(run, 0, mtime=100.0, fault="Segmentation fault")
    assert str(diagnose(run, 2, "", Ending(None))).startswith("rank 0 of 2 crashed in native code (SIGSEGV)")


def test_rank_killed_from_outside_is_blamed_over_the_errors_it_caused(run: RunDir) -> None:
    exited(run, 2, -9, "SIGKILL")  # the out-of-memory killer leaves no record of its own
    raised(run, 0, "RuntimeError", "Connection closed by peer", at=time.time())
    exited(run, 0, 1)
    error = diagnose(run, 4, "[rank2] epoch 1\n", FAILED)
    assert error.rank == 2
    assert str(error) == ("rank 2 of 4 was killed by SIGKILL. SIGKILL from outside usually means the machine "
                          "ran out of memory.\nIts last output:\n[rank2] epoch 1\n")


def test_rank_that_died_while_exiting(run: RunDir) -> None:
    run.write(DONE, 1, "")
    exited(run, 1, -9, "SIGKILL")
    assert "rank 1 of 2 finished its script, then died while exiting, by SIGKILL" in str(diagnose(run, 2, "", FAILED))


def test_the_failing_ranks_own_lines_are_shown_not_the_others(run: RunDir) -> None:
    """Four ranks print side by side; the message quotes only the failing rank's last lines."""
    crashed(run, 2, mtime=100.0)
    exited(run, 2, -6, "SIGABRT")
    log = "".join(f"[rank{rank}] step {step}\n" for step in range(12) for rank in range(4))
    text = str(diagnose(run, 4, log, FAILED))
    shown = [line for line in text.splitlines() if line.startswith("[rank")]
    assert shown == [f"[rank2] step {step}" for step in range(4, 12)]  # its last 8 lines, no other rank's


def test_rank_that_aborted_after_its_last_line_is_told_about_the_exit_race(run: RunDir) -> None:
    """A script run without the course's worker (or one that ends through Python's teardown) can
    abort after its work is done: SIGABRT with the rank's DONE record written."""
    for rank in range(4):
        run.write(DONE, rank, "")
    exited(run, 2, -6, "SIGABRT")
    error = diagnose(run, 4, "[rank2] epoch 1: loss 0.31\n", FAILED)
    text = str(error)
    assert error.rank == 2
    assert text.startswith("rank 2 of 4 finished its script, then died while exiting, by SIGABRT.")
    assert "gloo's exit race" in text and "How a rank ends" in text and "exit_without_teardown()" in text
    assert text.endswith("Its last output:\n[rank2] epoch 1: loss 0.31\n")


def test_every_rank_done_but_an_agent_failed_is_not_called_a_failed_start(run: RunDir) -> None:
    """Two agents: every rank finished, then one agent failed at torchrun's exit barrier."""
    for rank in range(4):
        run.write(DONE, rank, "")
    text = str(diagnose(run, 4, "", Ending(1, output="wait timeout after 300000ms")))
    assert text.startswith("every rank finished its script, then torchrun failed while the launch ended")
    assert "exit barrier" in text and "before the ranks could run" not in text
    run.file(DONE, 3).unlink()  # a rank that never finished and left no record
    error = diagnose(run, 4, "", Ending(1))
    assert str(error).startswith("torchrun failed while rank(s) [3] had not finished their script") and error.rank == 3


def test_sys_exit_names_the_code_and_where(run: RunDir) -> None:
    raised(run, 1, "SystemExit", "sys.exit(3)", at=100.0, line="sys.exit(3)")
    run.write_json(ERROR, 1, run.read_json(ERROR)[1] | {"exitcode": 3})
    exited(run, 1, 3)
    error = diagnose(run, 4, "[rank1] bad shard\n", FAILED)
    assert error.rank == 1
    assert str(error).startswith("rank 1 of 4 exited with code 3 (sys.exit(3)).\nIts last output:\n[rank1] bad shard\n")
    assert "sys.exit(3)" in str(error).split("Traceback")[1]


def test_exit_code_without_a_python_error(run: RunDir) -> None:
    exited(run, 0, -15, "SIGTERM")
    exited(run, 1, 7)  # os._exit(7): no exception, no record of the rank's own
    error = diagnose(run, 2, "", FAILED)
    assert (error.rank, str(error)) == (1, "rank 1 of 2 exited with code 7.")


def test_torchrun_failing_before_any_rank_shows_its_own_output(run: RunDir) -> None:
    error = diagnose(run, 4, "", Ending(1, output="torchrun: error: unrecognized arguments"))
    assert error.rank is None
    assert str(error) == "torchrun failed before the ranks could run. Its own output:\ntorchrun: error: unrecognized arguments"


def test_timeout_names_the_ranks_still_running(run: RunDir) -> None:
    run.write(DONE, 0, "")
    error = diagnose(run, 4, "[rank0] skipping the barrier\n", Ending(None, timeout=12))
    text = str(error)
    assert text.startswith("the launch ran past its timeout of 12 s; rank(s) [1, 2, 3] were still running")
    assert "Rank(s) [0] had finished their script" in text and "init_process_group" in text
    assert error.rank == 1 and "skipping the barrier" in error.log


def test_timeout_with_every_rank_running(run: RunDir) -> None:
    text = str(diagnose(run, 2, "", Ending(None, timeout=0.5)))
    assert "timeout of 0.5 s; rank(s) [0, 1] were still running" in text and "had finished" not in text


# What PyTorch 2.x prints for the causes learners meet most (first line of the exception).
NCCL_ON_CPU = ("RuntimeError", "Distributed package doesn't have NCCL built in")
SET_DEVICE_ON_CPU = ("AttributeError", "module 'torch._C' has no attribute '_cuda_setDevice'")
CUDA_ON_CPU = ("AssertionError", "Torch not compiled with CUDA enabled")
PORT_IN_USE = ("DistNetworkError", "The server socket has failed to listen on any local network address. "
               "port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")
NO_INIT = ("ValueError", "Default process group has not been initialized, please make sure to call init_process_group.")
CPU_OOM = ("RuntimeError", "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
           "you tried to allocate 140737488355328 bytes. Error code 12 (Cannot allocate memory)")
GPU_OOM = ("OutOfMemoryError", "CUDA out of memory. Tried to allocate 20.00 GiB.")
STDIN = ("EOFError", "EOF when reading a line")


@pytest.mark.parametrize("error, advice", [
    (NCCL_ON_CPU, "cards.backend"), (SET_DEVICE_ON_CPU, "cards.device(local_rank)"),
    (CUDA_ON_CPU, "four GPUs"), (PORT_IN_USE, "without init_method"), (NO_INIT, "init_process_group(cards.backend)"),
    (CPU_OOM, "ran out of memory"), (GPU_OOM, "smaller batch"), (STDIN, "no keyboard"),
], ids=["nccl", "set_device", "cuda", "port", "no_init", "cpu_oom", "gpu_oom", "stdin"])
def test_common_causes_get_advice(run: RunDir, error: tuple[str, str], advice: str) -> None:
    raised(run, 0, *error, at=100.0)
    text = str(diagnose(run, 4, "", FAILED, simulated=True))
    assert advice in text
    assert text.index("Traceback") < text.index(advice) < text.index("The other ranks were stopped")


def test_gpu_advice_only_on_simulated_cards() -> None:
    assert "simulated cards" in hint_for(": ".join(NCCL_ON_CPU), simulated=True)
    assert hint_for(": ".join(NCCL_ON_CPU), simulated=False) == ""
    assert hint_for("RuntimeError: shape '[16]' is invalid for input of size 9", simulated=True) == ""


def test_launch_error_keeps_rank_and_log() -> None:
    error = LaunchError("boom", 2, "[rank2] x\n")
    assert (str(error), error.rank, error.log) == ("boom", 2, "[rank2] x\n")


def test_timeout_after_every_rank_finished_its_script(run: RunDir) -> None:
    for rank in range(2):
        run.write(DONE, rank, "")
    error = diagnose(run, 2, "", Ending(None, timeout=120))
    assert str(error).startswith("the launch ran past its timeout of 120 s although every rank had finished")
    assert "while the others waited" not in str(error)  # no rank waited: nothing to blame on a missing collective
    assert error.rank is None
