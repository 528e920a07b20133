"""The rank side of every build exercise: join the group, import the learner's file, record the collectives.

An exercise module runs itself on the ranks (`torchrun(exercise_module_file, ...)`); its `__main__`
part starts with `start()`, which gives it the learner's module, this rank's device and the check's
parameters. Every collective the learner's code calls through `torch.distributed` is written down,
as it is called, in this rank's trace file (one JSON line each, flushed at once): the launch (which
collective, how many elements, asynchronous or not, in which phase of the check), and the `wait()` on
its handle. The trace outlives a rank that hangs or is stopped, so the kernel side can say which
collective a rank skipped (`harness.skipped_collective`) and, after a good run, in what order the
events came (overlap) and how big each message was (buckets, shards).

The phase is what the exercise says it is doing (`phase("backward 2")`); `event(...)` adds a mark of
the exercise's own (a gradient ready, the end of backward) to the same timeline.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from fourcard_helpers import detect, exit_without_teardown, report
from fourcard_helpers.language import _
from fourcard_helpers.rundir import LOCAL_RANK_ENV, TRACE, WORLD_SIZE_ENV, RunDir

COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "reduce", "all_to_all", "all_to_all_single", "send", "recv",
               "isend", "irecv", "barrier")

_trace: Any = None
DEVICE: torch.device | None = None  # this rank's card, set by start()
_phase = "start"
_count = 0


def event(kind: str, **values: Any) -> None:
    """Add one event to this rank's trace, at once (a later hang must not lose it)."""
    global _count
    _count += 1
    _trace.write(json.dumps({"n": _count, "kind": kind, "phase": _phase, **values}) + "\n")
    _trace.flush()


def phase(name: str) -> None:
    """Name what the check does now; every later event carries the name."""
    global _phase
    _phase = name


def _numel(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, str]:
    tensor = args[0] if args else next(iter(kwargs.values()), None)
    if isinstance(tensor, (list, tuple)):
        tensor = tensor[0] if tensor else None
    if isinstance(tensor, torch.Tensor):
        return tensor.numel(), str(tensor.dtype).removeprefix("torch.")
    return 0, ""


class _Handle:
    """A collective's handle as the learner's code gets it: the real one, whose wait() is recorded."""

    def __init__(self, work: Any, number: int) -> None:
        self._work, self._number = work, number

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        event("wait", of=self._number)
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _recorded(name: str, real: Any) -> Any:
    def collective(*args: Any, **kwargs: Any) -> Any:
        numel, dtype = _numel(args, kwargs)
        asynchronous = bool(kwargs.get("async_op", False))
        event("launch", op=name, numel=numel, dtype=dtype, asynchronous=asynchronous)
        number = _count
        work = real(*args, **kwargs)
        if not asynchronous:
            event("wait", of=number)
            return work
        return _Handle(work, number) if work is not None else None
    collective.__name__ = collective.__qualname__ = name
    collective.__doc__ = real.__doc__
    return collective


def load(path: str) -> ModuleType:
    """The learner's file, imported as a module of its own (its top-level code runs once per rank)."""
    spec = importlib.util.spec_from_file_location("learner_solution", path)
    assert spec is not None and spec.loader is not None, _("cannot import {path}").format(path=path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def start() -> tuple[ModuleType, torch.device, dict[str, Any]]:
    """Join the process group, start recording, import the learner's file: (module, device, parameters).

    Arguments (from the kernel side, harness.launch): the learner's file, the check's parameters as
    JSON, the folder for the traces. A collective that waits longer than the parameters'
    `collective_timeout` raises (gloo), so a partner that skipped it ends the launch in seconds."""
    global _trace, DEVICE
    learner, parameters, folder = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
    cards = detect(int(os.environ[WORLD_SIZE_ENV]))
    dist.init_process_group(cards.backend, timeout=timedelta(seconds=parameters["collective_timeout"]))
    device = DEVICE = cards.device(int(os.environ[LOCAL_RANK_ENV]))
    if cards.kind == "cuda":
        torch.cuda.set_device(device)
    _trace = open(RunDir(folder).file(TRACE, dist.get_rank()), "a", encoding="utf-8")  # noqa: SIM115 - kept open
    for name in COLLECTIVES:
        if hasattr(dist, name):
            setattr(dist, name, _recorded(name, getattr(dist, name)))
    return load(learner), device, parameters


def finish(**values: Any) -> None:
    """Send this rank's findings to the kernel and leave the group as every course script does."""
    phase("end")
    report(**values)
    _trace.close()
    dist.destroy_process_group()
    exit_without_teardown()


class TiedNet(torch.nn.Module):
    """The checks' small model: a layer used twice (a tied weight: its gradient is the sum of two uses),
    a frozen layer (no gradient), and a buffer (broadcast like the weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(6, 12)
        self.hidden = torch.nn.Linear(12, 12)
        self.frozen = torch.nn.Linear(12, 12).requires_grad_(False)
        self.out = torch.nn.Linear(12, 3)
        self.register_buffer("scale", torch.rand(12) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed(x)) * self.scale
        h = torch.tanh(self.hidden(torch.tanh(self.hidden(h))))
        return self.out(self.frozen(h))


def gap(ours: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """The largest difference between two lists of tensors."""
    return max(((a.detach().double() - b.detach().double()).abs().max().item() for a, b in zip(ours, reference)),
               default=0.0)


def optimizer_state_numbers(optimizer: Any) -> int:
    """Numbers of optimizer state a rank holds: the tensors of more than zero dimensions (Adam's exp_avg and
    exp_avg_sq, not its scalar step) in `.state` of the optimizer and of every optimizer it keeps, as an
    attribute or inside a list, tuple or dict (a ZeRO wrapper's inner ones), each storage counted once."""
    found: dict[int, Any] = {}

    def visit(value: Any, depth: int) -> None:
        if isinstance(value, torch.optim.Optimizer) and id(value) not in found:
            found[id(value)] = value
            visit(vars(value), depth + 1)
        elif depth < 4 and isinstance(value, dict):
            for item in value.values():
                visit(item, depth + 1)
        elif depth < 4 and isinstance(value, (list, tuple)):
            for item in value:
                visit(item, depth + 1)

    visit(optimizer, 0)
    storages = {}
    for each in found.values():
        for state in each.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.untyped_storage().nbytes():
                    storages[value.untyped_storage().data_ptr()] = (value.untyped_storage().nbytes()
                                                                    // value.element_size())
    return sum(storages.values())
