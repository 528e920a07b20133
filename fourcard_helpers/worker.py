"""What runs inside each rank of a launch.

`torchrun` starts `python -m fourcard_helpers.worker SCRIPT ARGS...` once per rank. This
module runs the lesson's script as `__main__` and adds the three things a notebook needs
from a rank that plain `python SCRIPT` does not give:

* `report(**values)` sends results back to the notebook (a JSON line per call);
* an exception is written down with the rank that raised it, so the notebook can show the
  first failing rank's traceback instead of torchrun's summary of every SIGTERM;
* the rank ends with `os._exit` once the script is done. Ending through normal interpreter
  shutdown destroys gloo's work objects in an arbitrary order and was seen to abort
  ("terminate called without an active exception", SIGABRT) in a fair share of runs.

It imports nothing but the standard library, so it adds almost nothing to start-up time.
"""
from __future__ import annotations

import ctypes
import faulthandler
import json
import linecache
import os
import re
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

RUN_DIR_ENV = "FOURCARD_RUN_DIR"  # where reports, errors and pids of this launch go
LABEL_ENV = "FOURCARD_SCRIPT_LABEL"
DOCTOR_ENV = "FOURCARD_DOCTOR"  # "0": do not watch the script for data-parallel mistakes  # the name tracebacks show for the script
REPO_ROOT = Path(__file__).resolve().parent.parent


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _jsonable(value: Any) -> Any:
    """Turn tensors, numpy values, tuples and dtypes into plain JSON data."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(item) for item in value]
    if hasattr(value, "tolist"):  # torch.Tensor, numpy arrays and scalars
        return _jsonable(value.detach().cpu().tolist() if hasattr(value, "detach") else value.tolist())
    if hasattr(value, "item"):
        return _jsonable(value.item())
    return str(value)  # dtypes, devices, paths: their printed form is what a lesson compares


def report(**values: Any) -> None:
    """Send values from this rank back to the notebook (`LaunchResult.reports[rank]`).

    Tensors become nested lists, so keep them small (a few hundred thousand numbers at
    most). Run outside the course's launcher (a script started with plain `torchrun`), the
    values are printed instead, so the same script still tells you its results.
    """
    data = _jsonable(values)
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        print(f"report from rank {_rank()}: {json.dumps(data)}", flush=True)
        return
    line = json.dumps(data) + "\n"
    with open(Path(run_dir) / f"report.{_rank()}", "a", encoding="utf-8") as out:
        out.write(line)


def shorten_paths(text: str) -> str:
    """Replace machine-specific prefixes in a traceback with short, portable ones."""
    text = re.sub(r'"[^"\n]*?/site-packages/', '"<site-packages>/', text)
    text = re.sub(r'"[^"\n]*?/lib/python3\.\d+/', '"<python>/', text)
    return text.replace(str(REPO_ROOT) + os.sep, "")


def _die_with_parent() -> None:
    """Ask Linux to kill this rank if torchrun dies, so a killed kernel leaves no rank behind."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _write(name: str, text: str) -> None:
    run_dir = os.environ.get(RUN_DIR_ENV)
    if run_dir:
        partial = Path(run_dir) / f"{name}.partial"
        partial.write_text(text, encoding="utf-8")
        partial.rename(Path(run_dir) / name)  # the launcher never sees half a file


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def main(argv: list[str]) -> None:
    """Run `argv[0]` as `__main__` with `argv[1:]` as its arguments, then exit this rank."""
    if not argv:
        sys.exit("usage: python -m fourcard_helpers.worker SCRIPT [ARGS...]")
    _die_with_parent()
    rank = _rank()
    _write(f"pid.{rank}", str(os.getpid()))
    run_dir = os.environ.get(RUN_DIR_ENV)
    if run_dir:
        # A crash in native code (a C++ abort in gloo, a segfault) skips every except clause;
        # faulthandler still writes the Python stack at that moment, and the file's time tells
        # the launcher which rank went down first.
        crash_log = open(Path(run_dir) / f"crash.{rank}", "w", encoding="utf-8")  # noqa: SIM115
        faulthandler.enable(crash_log)
    script = Path(argv[0])
    label = os.environ.get(LABEL_ENV, str(script))
    source = script.read_text(encoding="utf-8")
    # Register the source under its label so tracebacks show the script's own lines.
    linecache.cache[label] = (len(source), None, source.splitlines(True), label)
    sys.argv = [str(script), *argv[1:]]
    sys.path.insert(0, str(script.resolve().parent))
    namespace = {"__name__": "__main__", "__file__": str(script), "__builtins__": __builtins__}
    code = 0
    observer = None
    if run_dir and os.environ.get(DOCTOR_ENV, "1") != "0":
        from .doctor import Observer

        observer = Observer()
        observer.install()
    try:
        exec(compile(source, label, "exec"), namespace)
    except SystemExit as stop:
        if isinstance(stop.code, int) or stop.code is None:
            code = stop.code or 0
        else:  # sys.exit("message"): print it, as Python itself would
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException as error:  # noqa: BLE001 - every failure must reach the notebook
        frames = traceback.extract_tb(error.__traceback__)[1:]  # drop this module's exec frame
        lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames)]
        lines += traceback.format_exception_only(type(error), error)
        text = shorten_paths("".join(lines))
        _write(
            f"error.{rank}",
            json.dumps({"rank": rank, "time": time.time(), "type": type(error).__name__,
                        "message": str(error), "traceback": text}),
        )
        if not os.environ.get(RUN_DIR_ENV):  # under the launcher, its LaunchError shows it
            print(text, file=sys.stderr, end="")
        code = 1
    _flush()
    if code == 0:
        if observer is not None:
            _write(f"doctor.{rank}", json.dumps(observer.record()))
        _write(f"done.{rank}", "")
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
