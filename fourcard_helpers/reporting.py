"""What a rank sends back to the notebook: `report()`'s values, and tracebacks with portable paths;
and how a rank ends: `exit_without_teardown()`, the last line of every course script that joins a group.

A lesson's script calls `report(name=value, ...)` in each rank; the launcher gathers the values
into `LaunchResult.reports[rank]` (and the warm session into `RankSession.reports`). Values
travel as JSON lines in the run folder (rundir.py), so only plain data can travel: numbers,
strings, lists, dicts, tensors and numpy values; anything else is refused where it is reported,
not found meaningless in the notebook later.

Standard library only until a value needs converting: every rank imports this.
"""
from __future__ import annotations

import os
import re
import sys
import time
import traceback
from pathlib import Path, PurePath
from typing import Any

from .language import _
from .rundir import RANK_ENV, REPORT, RunDir

REPO_ROOT = Path(__file__).resolve().parent.parent


def exit_without_teardown() -> None:
    """End this rank here, skipping Python's teardown, in which gloo can abort a rank whose work is done.

    gloo hands back a finished collective's tensors on its own thread, a moment after waking the
    rank; if Python is shutting down by then, that thread cannot take the GIL, Python ends it, and
    the C++ runtime aborts the process (lesson 00, "How a rank ends"; PyTorch issue #38228). Every
    course script that joins a group calls this after `destroy_process_group()`, which alone cannot
    stop the thread while anything still holds the group (after DDP, `torch.distributed.nn` does).
    """
    sys.stdout.flush()  # print() to a pipe is buffered: os._exit would drop what is still held
    sys.stderr.flush()
    os._exit(0)  # no atexit handler runs and no thread is asked to stop; the system reclaims the rest


def this_rank() -> int:
    """This process's global rank (0 outside a launch, as for a plain `python script.py`)."""
    return int(os.environ.get(RANK_ENV, "0"))


def _jsonable(value: Any, name: str) -> Any:
    """Plain JSON data for a reported value: tensors and numpy values become (nested) lists or
    numbers; dtypes, devices and paths their printed form, which is what a lesson compares.

    Anything else is refused: its printed form ('<object object at 0x...>') would arrive in
    the notebook looking like data and mean nothing.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(key): _jsonable(item, f"{name}[{key!r}]") for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(item, f"{name}[{index}]") for index, item in enumerate(value)]
    if hasattr(value, "tolist"):  # torch.Tensor, numpy arrays and scalars
        return _jsonable(value.detach().cpu().tolist() if hasattr(value, "detach") else value.tolist(), name)
    if hasattr(value, "item"):
        return _jsonable(value.item(), name)
    if isinstance(value, PurePath) or type(value).__name__ in ("dtype", "device", "DType") or \
            type(value).__module__.startswith("numpy"):
        return str(value)
    raise TypeError(_("report({name}=...) got a value of type {type}, which cannot travel to the notebook: report "
                      "numbers, strings, lists, dicts, tensors or numpy values (pass str(...) if its printed form is "
                      "what you want to compare).").format(
                          name=name, type=f"{type(value).__module__}.{type(value).__qualname__}"))


def report(**values: Any) -> None:
    """Send values from this rank back to the notebook (`LaunchResult.reports[rank]`).

    Tensors become nested lists, so keep them small (a few hundred thousand numbers at
    most). Run outside the course's launcher (a script started with plain `torchrun`), the
    values are printed instead, so the same script still tells you its results.
    """
    import json  # only a reporting rank pays for it

    data = {name: _jsonable(value, name) for name, value in values.items()}
    run = RunDir.from_env()
    if run is None:
        print(f"report from rank {this_rank()}: {json.dumps(data)}", flush=True)  # a line lesson 12b finds in a job's log
        return
    run.append_json(REPORT, this_rank(), data)


def shorten_paths(text: str) -> str:
    """Replace machine-specific prefixes in a traceback (or in a line a rank printed) with short, portable ones."""
    text = re.sub(r'"[^"\n]*?/site-packages/', '"<site-packages>/', text)
    text = re.sub(r'"[^"\n]*?/lib/python3\.\d+/', '"<python>/', text)
    return text.replace(str(REPO_ROOT) + os.sep, "")


def error_record(error: BaseException, rank: int, frames: list[traceback.FrameSummary], when: float | None = None,
                 **more: Any) -> dict[str, Any]:
    """The one shape of a failure's record, a launch's rank's (the run folder's `error` record) or a warm
    session's: rank, time, type, message and the traceback of `frames` (the script's own, with portable
    paths), and what `more` adds (a non-zero exit's exitcode)."""
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames)]
    lines += traceback.format_exception_only(type(error), error)
    return {"rank": rank, "time": time.time() if when is None else when, "type": type(error).__name__,
            "message": str(error), "traceback": shorten_paths("".join(lines)), **more}
