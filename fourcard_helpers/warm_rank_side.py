"""What runs on each rank of a warm session (warm_session.py): a cell, a pull, a push.

ipyparallel carries these functions to the ranks as their code and the name of this module, and each
rank imports the module for their globals (ipyparallel's CannedFunction): so they live apart from the
notebook's side, and a rank imports no more than they need (not the session, not IPython's magics).
A cell, a pull and a push each return {"value": ...} or {"error": record}, a record as a launch's rank
writes its own (reporting.error_record), so that the notebook explains both alike (diagnose.raised).
"""
from __future__ import annotations

import ast
import linecache
import os
import pickle
import traceback
from typing import Any

from .language import _
from .reporting import error_record
from .rundir import RANK_ENV


def _shell() -> Any:
    from IPython import get_ipython

    shell = get_ipython()  # the engine's own IPython shell
    shell.user_ns.setdefault("get_ipython", get_ipython)  # cells with %magics call it
    return shell


def _namespace() -> dict[str, Any]:
    return _shell().user_ns


def identity() -> int:
    """This rank: ipyparallel numbers engines as they register, not by rank."""
    return int(os.environ[RANK_ENV])


def _to_cpu(value: Any) -> Any:
    """Tensors come back on the CPU: the notebook need not (and on a GPU box should not) touch CUDA."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(item) for item in value)
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    return value


def _portable(value: Any) -> Any:
    """The value itself if it can travel to the notebook, else its printed form."""
    value = _to_cpu(value)
    try:
        pickle.dumps(value)
    except Exception:  # noqa: BLE001 - anything unpicklable is shown, not returned
        return repr(value)
    return value


def _failure(error: BaseException, skip: int) -> dict[str, Any]:
    """A cell's failure, as a launch's rank records its own (reporting.error_record)."""
    frames = traceback.extract_tb(error.__traceback__)[skip:]  # drop this module's frames
    return {"error": error_record(error, int(os.environ[RANK_ENV]), frames)}


def execute(source: str, label: str) -> dict[str, Any]:
    """Run a cell in this rank's namespace; the value of a last bare expression comes back."""
    shell = _shell()
    namespace = shell.user_ns
    # Each cell keeps its source under its own name: tracebacks and inspect.getsource show it.
    linecache.cache[label] = (len(source), None, source.splitlines(True), label)
    try:
        tree = ast.parse(shell.transform_cell(source), label)  # %magics keep their line numbers
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, label, "exec"), namespace)  # noqa: S102 - the learner's own cell
        value = eval(compile(ast.Expression(last.value), label, "eval"), namespace) if last else None
    except BaseException as error:  # noqa: BLE001 - every failure must reach the notebook
        return _failure(error, skip=1)
    # No flush here: the engine flushes stdout and stderr before it sends the reply
    # (ipyparallel's apply_request), and a second flush costs each rank a wait for its I/O thread.
    return {"value": _portable(value)}


def fetch(name: str) -> dict[str, Any]:
    """This rank's value of `name` (`%ranks pull`); a missing name is a NameError with no traceback."""
    namespace = _namespace()
    if name not in namespace:
        missing = NameError(_("name {name} is not defined on this rank").format(name=repr(name)))
        return {"error": {**error_record(missing, int(os.environ[RANK_ENV]), []), "traceback": ""}}  # no code ran
    return {"value": _portable(namespace[name])}


def store(**values: Any) -> dict[str, Any]:
    """The notebook's `values` as names of this rank (`%ranks push`)."""
    _namespace().update(values)
    return {"value": None}
