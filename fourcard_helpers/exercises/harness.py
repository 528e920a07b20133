"""The kernel side every build exercise shares: the skeleton found without a launch, the launch of the
exercise's rank script on the learner's file, and a failed launch turned into a sentence.

A rank that skipped a collective is named from the ranks' traces (_ranks.py): the first collective
that some ranks launched and another never did. The ranks' collectives time out after
COLLECTIVE_TIMEOUT seconds, so such a launch ends by itself soon, and LAUNCH_TIMEOUT stops anything
else that hangs; either way the check names what the traces show, never freezes the cell.
"""
from __future__ import annotations

import ast
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..check import CheckFailed
from ..diagnose import LaunchError
from ..language import _
from ..launch import torchrun
from ..rundir import TRACE, RunDir

COLLECTIVE_TIMEOUT = 20.0  # seconds a rank waits in a collective for a partner that never comes
LAUNCH_TIMEOUT = 180.0  # seconds before every rank is stopped, whatever they do


@dataclass
class Result:
    """What the ranks found: `reports[rank]` (what each passed to _ranks.finish) and `traces[rank]`
    (its collectives and marks, in order)."""

    reports: dict[int, dict[str, Any]]
    traces: dict[int, list[dict[str, Any]]]


def skeleton(path: Path, defines: Sequence[str]) -> None:
    """Raise NotImplementedError if a required definition still says a bare `raise NotImplementedError`
    (in its body or one of its methods: the skeleton's placeholder; one with a message is the learner's
    own), CheckFailed if the file lacks one or does not parse."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        tree = ast.parse(text)
    except SyntaxError as error:
        raise CheckFailed(_("{path}, line {line}: {message}").format(
            path=Path(path).name, line=error.lineno, message=error.msg)) from None
    found = {node.name: node for node in tree.body
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    missing = [name for name in defines if name not in found]
    if missing:
        raise CheckFailed(_("{path} does not define {names}: the exercise asks for {wanted}.").format(
            path=Path(path).name, names=", ".join(missing), wanted=", ".join(defines)))
    for name in defines:
        for node in ast.walk(found[name]):
            if isinstance(node, ast.Raise) and node.exc is not None:
                call = isinstance(node.exc, ast.Call)
                raised = node.exc.func if call else node.exc
                bare = not call or not (node.exc.args or node.exc.keywords)
                if bare and isinstance(raised, ast.Name) and raised.id == "NotImplementedError":
                    raise NotImplementedError(_("{name} in {path} still raises NotImplementedError (line {line})."
                                                ).format(name=name, path=Path(path).name, line=node.lineno))


Explain = Callable[[dict[int, list[dict[str, Any]]]], "str | None"]


def launch(exercise_file: str, path: Path, nproc: int, explain: Explain | None = None, **parameters: Any) -> Result:
    """Run the exercise's file on `nproc` ranks with the learner's file; each rank gets `parameters`.

    A failure raises CheckFailed: what `explain` reads in the ranks' traces (the exercise's own
    diagnosis, such as a shard of the wrong size that made a later step fail), else the rank that
    skipped a collective, else the first rank's error."""
    folder = Path(tempfile.mkdtemp(prefix="fourcard-exercise-"))
    parameters = {"collective_timeout": COLLECTIVE_TIMEOUT, **parameters}
    try:
        try:
            result = torchrun(Path(exercise_file), nproc=nproc, timeout=LAUNCH_TIMEOUT, echo=False, doctor=False,
                              args=[str(Path(path).resolve()), json.dumps(parameters), str(folder)])
        except LaunchError as error:
            found = traces(folder, nproc)
            cause = (explain(found) if explain else None) or skipped_collective(found)
            if cause:
                raise CheckFailed(cause) from None
            raise CheckFailed(_("a rank failed while running your code. {error}").format(error=error)) from None
        return Result(result.reports, traces(folder, nproc))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def traces(folder: Path, nproc: int) -> dict[int, list[dict[str, Any]]]:
    """Each rank's events, as far as it got."""
    written = RunDir(folder).read_text(TRACE)
    return {rank: [json.loads(line) for line in written.get(rank, "").splitlines() if line.endswith("}")]
            for rank in range(nproc)}


def launches(trace: list[dict[str, Any]], phase: str | None = None) -> list[dict[str, Any]]:
    """The collectives a rank launched (in one phase, or all)."""
    return [e for e in trace if e["kind"] == "launch" and (phase is None or e["phase"] == phase)]


def skipped_collective(traces: dict[int, list[dict[str, Any]]]) -> str | None:
    """A sentence naming the first collective some ranks launched and another rank never did, or None.

    Collectives match by position: the k-th collective of every rank meets the k-th of the others."""
    calls = {rank: launches(trace) for rank, trace in traces.items()}
    most = max((len(c) for c in calls.values()), default=0)
    for k in range(most):
        absent = [rank for rank, c in calls.items() if len(c) <= k]
        present = [rank for rank, c in calls.items() if len(c) > k]
        if absent:
            call = calls[present[0]][k]
            return _("rank(s) {absent} never launched collective number {number}, the {op} of {numel} elements "
                     "that rank(s) {present} launched during {phase}: they waited for a partner that never came "
                     "until the time limit. Every rank must call every collective, in the same order (an `if rank "
                     "== 0:` or a condition that differs between ranks around a collective is the usual cause)."
                     ).format(absent=absent, number=k + 1, op=call["op"], numel=call["numel"],
                              present=present, phase=call["phase"])
        shapes = {(c[k]["op"], c[k]["numel"]) for c in calls.values()}
        if len(shapes) > 1:
            described = "; ".join(_("rank {rank}: {op} of {numel} elements during {phase}").format(
                rank=rank, op=c[k]["op"], numel=c[k]["numel"], phase=c[k]["phase"]) for rank, c in calls.items())
            return _("the ranks' collective number {number} differs between ranks ({described}): a rank skipped "
                     "or added a collective before it. Every rank must call the same collectives in the same "
                     "order.").format(number=k + 1, described=described)
    return None
