"""What runs inside each rank of a launch.

`torchrun` starts `python -m fourcard_helpers.worker SCRIPT ARGS...` once per rank. This
module runs the lesson's script as `__main__`, as `python SCRIPT` would, and leaves the
records the notebook reads in the run folder (see rundir.py):

* what the script passes to `report(**values)` arrives as JSON lines (reporting.py);
* the rank's output goes to its own files, so the notebook can show each line with its rank;
* an exception (or a non-zero `sys.exit`) is written down with its time, so the notebook can
  show the first failing rank's traceback instead of torchrun's summary of every SIGTERM;
* the rank ends the way a script ends in a terminal (non-daemon threads joined, `atexit`
  handlers run, open files flushed), then with `os._exit`, skipping the interpreter's own
  teardown. That teardown can abort a gloo rank (SIGABRT, "terminate called without an
  active exception"): a gloo worker thread hands back its last collective a moment after the
  rank was woken from it, and if Python is finalizing by then, the thread cannot take the
  GIL to release the collective's tensors; Python ends the thread mid-C++ and the C++
  runtime aborts (a core dump's backtrace: notebooks/measured/exit_abort_backtrace.txt;
  counts: notebooks/measured/exit_race.json). A script cannot always prevent it:
  `destroy_process_group()` stops those threads only when nothing else holds the group, and
  after DDP something does (`torch.distributed.nn`'s default arguments). So every shipped script
  that joins a group ends the same way, with `exit_without_teardown()` (a flush, then
  `os._exit(0)`) after `destroy_process_group()` (lesson 00, "How a rank ends"); a script that
  does not, still ends cleanly here. When the script calls `os._exit` itself, the worker takes it
  as the script's end: it writes its records and exits with the script's code at once, doing
  nothing that `os._exit` skips (no thread waited for, no `atexit` handler, no buffer flushed),
  as in a terminal.

It imports nothing but the standard library, so it adds almost nothing to start-up time.
"""
from __future__ import annotations

import atexit
import builtins
import faulthandler
import functools
import io
import linecache
import os
import sys
import threading
import time
import traceback
import weakref
from pathlib import Path
from typing import Any

from .language import _
from .lifecycle import die_with_parent
from .reporting import error_record, this_rank
from .rundir import CRASH, DOCTOR, DOCTOR_ENV, DONE, ERROR, LABEL_ENV, LOCAL_RANK_ENV, PID, STDERR, STDOUT, RunDir, setting


def _die_with_parent() -> None:
    """Ask Linux to kill this rank if torchrun dies, so a killed kernel leaves no rank behind."""
    if not die_with_parent() and sys.platform.startswith("linux") and os.environ.get(LOCAL_RANK_ENV, "0") == "0":
        print(_("fourcard: this system's C library has no prctl(), so ranks cannot ask to die with torchrun; if "
                "torchrun is killed, stop its ranks yourself (see leftover_processes())."), file=sys.stderr, flush=True)


def _redirect_output(run: RunDir, rank: int) -> None:
    """Send this rank's file descriptors 1 and 2 to its own files in the run folder, so that
    native code (gloo's warnings, a C++ abort message) lands there too, not only Python's."""
    for fd, kind in ((1, STDOUT), (2, STDERR)):
        target = os.open(run.file(kind, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)


def _error_record(error: BaseException, rank: int, when: float) -> dict[str, Any]:
    # The script's frames (and the libraries it called), not this module's exec or report().
    here = Path(__file__).resolve()
    plumbing = {str(here), str(here.with_name("rundir.py")), str(here.with_name("reporting.py"))}
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if str(Path(frame.filename).resolve()) not in plumbing]
    return error_record(error, rank, frames, when)


def _end_as_a_terminal_would() -> None:
    """What Python does at exit that a script can notice: wait for the script's non-daemon
    threads, run its `atexit` handlers, flush stdout/stderr and the files it left open.
    Only the destruction of every object is skipped (see the module's docstring)."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # prints a failing handler's traceback, as the interpreter does
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    for file in list(_OPENED):  # files the script opened and never closed
        try:
            if not file.closed and file.writable():
                file.flush()
        except (OSError, ValueError):
            pass


class _ScriptCalledExit(BaseException):
    """The script called `os._exit(code)`: end the rank as it asked, after the worker's records."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


_REAL_EXIT = os._exit
_MAIN_PID = os.getpid()


def _exit_from_script(code: int = 0) -> None:
    """`os._exit` while the script runs. In the rank's main thread it ends the script (and the
    worker then ends the rank with that code); anywhere else (a forked DataLoader worker, a
    thread) it is the real `os._exit`, which multiprocessing's children rely on."""
    if os.getpid() == _MAIN_PID and threading.current_thread() is threading.main_thread():
        raise _ScriptCalledExit(code)
    _REAL_EXIT(code)


_OPENED: weakref.WeakSet[Any] = weakref.WeakSet()
_REAL_OPEN = io.open


@functools.wraps(_REAL_OPEN)
def _open_and_remember(*args: Any, **kwargs: Any) -> Any:
    """`open`, remembering the file so that the rank can flush it at exit if the script does
    not close it. (Scanning every live object for files instead costs about a second per rank
    on a busy machine.) A weak set: a file the script drops is closed, and flushed, as usual."""
    file = _REAL_OPEN(*args, **kwargs)
    _OPENED.add(file)
    return file


def main(argv: list[str]) -> None:
    """Run `argv[0]` as `__main__` with `argv[1:]` as its arguments, then exit this rank."""
    if not argv:
        sys.exit("usage: python -m fourcard_helpers.worker SCRIPT [ARGS...]")
    _die_with_parent()
    rank = this_rank()
    run = RunDir.from_env()
    if run is not None:
        _redirect_output(run, rank)
        run.write(PID, rank, str(os.getpid()))
        for kind in (ERROR, DONE):  # an elastic restart's earlier attempt ended; this one starts clean
            run.file(kind, rank).unlink(missing_ok=True)
        # A crash in native code (a C++ abort in gloo, a segfault) skips every except clause;
        # faulthandler still writes the Python stack at that moment, and the file's time tells
        # the launcher which rank went down first.
        crash_log = open(run.file(CRASH, rank), "w", encoding="utf-8")  # noqa: SIM115
        faulthandler.enable(crash_log)
    script = Path(argv[0])
    label = setting(LABEL_ENV) or str(script)
    source = script.read_text(encoding="utf-8")
    # Register the source under its label so tracebacks show the script's own lines.
    linecache.cache[label] = (len(source), None, source.splitlines(True), label)
    sys.argv = [str(script), *argv[1:]]
    sys.path.insert(0, str(script.resolve().parent))
    namespace = {"__name__": "__main__", "__file__": str(script), "__builtins__": __builtins__}
    builtins.open = io.open = _open_and_remember  # pathlib and os.fdopen go through io.open
    code = 0
    ended_itself = False  # the script ended itself with os._exit: no thread, handler or buffer is waited for
    observer = None
    if run is not None and setting(DOCTOR_ENV, "1") != "0":
        from .doctor import Observer  # imports torch, which the script is about to import anyway

        observer = Observer()
        observer.install()
    os._exit = _exit_from_script
    try:
        exec(compile(source, label, "exec"), namespace)
    except _ScriptCalledExit as stop:
        code, ended_itself = stop.code, True
        if code and run is not None:
            record = _error_record(stop, rank, time.time())
            record["message"] = f"os._exit({code})"
            run.write_json(ERROR, rank, record | {"type": "SystemExit", "exitcode": code})
    except SystemExit as stop:
        when = time.time()
        if isinstance(stop.code, int) or stop.code is None:
            code = stop.code or 0
        else:  # sys.exit("message"): print it, as Python itself would
            print(stop.code, file=sys.stderr)
            code = 1
        if code and run is not None:
            record = _error_record(stop, rank, when)
            record["message"] = f"sys.exit({stop.code!r})"
            run.write_json(ERROR, rank, record | {"exitcode": code})
    except BaseException as error:  # noqa: BLE001 - every failure must reach the notebook
        record = _error_record(error, rank, time.time())  # when it reached the script, not when written
        if run is not None:
            run.write_json(ERROR, rank, record)
        else:
            print(record["traceback"], file=sys.stderr, end="")
        code = 1
    finally:
        os._exit = _REAL_EXIT
    if code == 0 and run is not None:
        if observer is not None:
            run.write_json(DOCTOR, rank, observer.record())
        run.write(DONE, rank, "")
    if not ended_itself:  # after the script's own os._exit nothing more happens, as in a terminal
        _end_as_a_terminal_would()
    _REAL_EXIT(code)


if __name__ == "__main__":
    main(sys.argv[1:])
