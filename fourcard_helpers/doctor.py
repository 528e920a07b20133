"""The DDP doctor: spots the classic data-parallel mistakes in a script that otherwise ran fine.

Most data-parallel bugs fail silently: a model never wrapped in DDP trains four separate
models, a sampler without `set_epoch` replays the same order every epoch, four ranks write
one checkpoint file over each other. Nothing crashes, so nothing tells the learner. The
launcher sees every rank, so it can.

Two halves, joined by one record per rank in the launch's run folder:

* `Observer` runs inside each rank (worker.py installs it before the script). It watches a
  few library entry points (the optimizer step, DistributedSampler, DataLoader, torch.save,
  DDP's constructor) and the process groups' collective counters, and keeps small facts:
  no tensors, no references that would keep the script's objects alive.
* `examine(records)` runs in the notebook after the launch and turns the ranks' facts into
  warnings: what was seen (with numbers), the likely cause, the fix, the lesson.

False alarms teach the wrong lesson, so each check speaks only when the evidence is plain:
weights are compared only where ranks must hold the same replica (inside DDP, or when the
ranks never communicated at all), never for pipeline stages, tensor-parallel or FSDP shards.
"""
from __future__ import annotations

import functools
import itertools
import math
import os
import sys
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .language import _, sentences

_KEY = "_fourcard_doctor_key"  # set on samplers and optimizers: id() is reused once an object is freed
_keys = itertools.count()
SAMPLES_PER_PARAMETER = 16  # elements compared per parameter: cheap, and enough to see a divergence
WEIGHT_TOLERANCE = 1e-5  # replicas agree to rounding; a never-averaged model differs by far more


def _never_fails(method: Callable[..., None]) -> Callable[..., None]:
    """The doctor runs inside the learner's script (in optimizer steps, samplers, loaders): a fault
    of its own must never break that script. It gives up watching instead, and says nothing."""

    @functools.wraps(method)
    def guarded(self: "Observer", *args: Any, **kwargs: Any) -> None:
        if self.broken:
            return
        try:
            method(self, *args, **kwargs)
        except Exception:  # noqa: BLE001 - anything: the script matters more than the diagnosis
            self.broken = True

    return guarded


def _key(obj: Any) -> int:
    """A number that names `obj` for the whole run (unlike id(), never reused by a later object)."""
    if not hasattr(obj, _KEY):
        setattr(obj, _KEY, next(_keys))
    return getattr(obj, _KEY)


def _sample_positions(numel: int) -> list[int]:
    count = min(numel, SAMPLES_PER_PARAMETER)
    return [round(i * (numel - 1) / max(count - 1, 1)) for i in range(count)]


def _is_shard(tensor: Any) -> bool:
    """DTensor parameters (FSDP2, tensor parallel) legitimately differ between ranks."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(tensor, getattr(dtensor, "DTensor", ()))


@dataclass
class Observer:
    """Facts one rank gathers while its script runs (see the module docstring)."""

    steps: int = 0
    broken: bool = False  # a fault of the doctor's own: it stopped watching, and reports nothing
    collectives_at_first_step: int | None = None
    collectives_at_last_step: int = 0
    joined_group: bool = False
    collectives_at_exit: int | None = None  # counted when the group is destroyed, if it is
    used_ddp: bool = False
    ddp_parameters: dict[int, weakref.ref] = field(default_factory=dict)  # id → parameter inside a DDP module
    last_samples: dict[int, tuple[list[tuple[int, ...]], list[Any], bool]] = field(default_factory=dict)
    optimizers: dict[int, weakref.ref] = field(default_factory=dict)  # weak: the doctor keeps nothing alive
    sampler_epochs: dict[int, list[int]] = field(default_factory=dict)  # shuffling samplers only
    padded_evaluations: list[dict[str, int]] = field(default_factory=list)
    saved_paths: list[str] = field(default_factory=list)
    first_batches: list[list[float]] = field(default_factory=list)

    # -- what the script does ---------------------------------------------------------
    def install(self) -> None:
        """Hook the library entry points. Called once per rank, before the script runs."""
        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader, DistributedSampler

        observer = self
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(self._after_step)

        sampler_iter = DistributedSampler.__iter__

        def watched_sampler_iter(sampler: DistributedSampler):  # type: ignore[no-untyped-def]
            observer._sampler_iterated(sampler)
            return sampler_iter(sampler)

        DistributedSampler.__iter__ = watched_sampler_iter  # type: ignore[method-assign]

        loader_iter = DataLoader.__iter__

        def watched_loader_iter(loader: DataLoader):  # type: ignore[no-untyped-def]
            iterator = loader_iter(loader)
            return _FirstBatch(iterator, observer) if torch.is_grad_enabled() else iterator

        DataLoader.__iter__ = watched_loader_iter  # type: ignore[method-assign]

        save = torch.save

        def watched_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(f, (str, os.PathLike)):
                observer.saved_paths.append(str(Path(f).resolve()))
            return save(obj, f, *args, **kwargs)

        torch.save = watched_save

        init = dist.init_process_group

        def watched_init(*args: Any, **kwargs: Any) -> Any:
            observer.joined_group = True
            return init(*args, **kwargs)

        dist.init_process_group = watched_init
        destroy = dist.destroy_process_group

        def watched_destroy(*args: Any, **kwargs: Any) -> Any:
            observer.collectives_at_exit = observer._collectives()  # the counters go with the group
            return destroy(*args, **kwargs)

        dist.destroy_process_group = watched_destroy
        ddp = torch.nn.parallel.DistributedDataParallel
        ddp_init = ddp.__init__

        def watched_ddp_init(module: Any, *args: Any, **kwargs: Any) -> None:
            ddp_init(module, *args, **kwargs)
            observer.used_ddp = True
            observer.ddp_parameters.update((id(p), weakref.ref(p)) for p in module.module.parameters())

        ddp.__init__ = watched_ddp_init  # type: ignore[method-assign]

    def _collectives(self) -> int:
        """Collectives issued so far on every process group of this rank (their sequence numbers)."""
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return self.collectives_at_exit if self.collectives_at_exit is not None else self.collectives_at_last_step
        total = 0
        for group in list(dist.distributed_c10d._world.pg_map):
            try:
                total += group._get_sequence_number_for_group()
            except (RuntimeError, AttributeError):  # a backend without counters: count nothing
                pass
        return total

    @_never_fails
    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1
        count = self._collectives()
        if self.collectives_at_first_step is None:
            self.collectives_at_first_step = count
        self.collectives_at_last_step = count
        self.optimizers[_key(optimizer)] = weakref.ref(optimizer)
        self._sample(optimizer)

    def _in_ddp(self, parameter: Any) -> bool:
        """Whether DDP wraps this very tensor (by identity: tensors compare element-wise, and ids get reused)."""
        ref = self.ddp_parameters.get(id(parameter))
        return ref is not None and ref() is parameter

    def _sample(self, optimizer: Any) -> None:
        """Note a few weights of each of the optimizer's parameter groups, as they are now."""
        import torch

        with torch.no_grad():
            for group_index, group in enumerate(optimizer.param_groups):
                params = [p for p in group["params"] if not _is_shard(p)]
                shapes = [tuple(p.shape) for p in params]
                samples = [p.detach().reshape(-1)[_sample_positions(p.numel())].clone() for p in params if p.numel()]
                in_ddp = bool(params) and all(self._in_ddp(p) for p in params)
                self.last_samples[_key(optimizer) * 100 + group_index] = (shapes, samples, in_ddp)

    @_never_fails
    def _sampler_iterated(self, sampler: Any) -> None:
        import torch

        if sampler.shuffle:
            self.sampler_epochs.setdefault(_key(sampler), []).append(sampler.epoch)
        padding = sampler.total_size - len(sampler.dataset)
        if not sampler.drop_last and padding > 0 and not torch.is_grad_enabled():
            self.padded_evaluations.append({"dataset": len(sampler.dataset), "padding": padding,
                                            "collectives_before": self._collectives()})

    @_never_fails
    def _note_first_batch(self, batch: Any) -> None:
        first = batch[0] if isinstance(batch, (list, tuple)) else batch
        if hasattr(first, "reshape") and getattr(first, "numel", lambda: 0)():
            flat = first.detach().reshape(-1).double()
            self.first_batches.append([float(flat.sum()), float(flat[_sample_positions(flat.numel())].sum())])

    @_never_fails
    def _sample_final_weights(self) -> None:
        for optimizer in filter(None, (ref() for ref in self.optimizers.values())):
            self._sample(optimizer)  # after anything that ran past the last step (Join's final broadcast)

    # -- what the rank reports ----------------------------------------------------------
    def record(self) -> dict[str, Any]:
        """The facts as plain JSON data, taken when the script has finished."""
        self._sample_final_weights()
        if self.broken:
            return {"broken": True}
        weights = []
        for shapes, samples, in_ddp in self.last_samples.values():
            weights.append({"shapes": [list(s) for s in shapes], "in_ddp": in_ddp,
                            "values": [[float(v) for v in s.float().cpu().tolist()] for s in samples]})
        return {
            "steps": self.steps, "joined_group": self.joined_group, "used_ddp": self.used_ddp,
            "collectives_while_training": (self.collectives_at_last_step - self.collectives_at_first_step
                                           if self.collectives_at_first_step is not None else 0),
            "collectives_at_end": self._collectives(),
            "weights": weights,
            "sampler_epochs": list(self.sampler_epochs.values()),
            "padded_evaluations": self.padded_evaluations,
            "saved_paths": sorted(set(self.saved_paths)),
            "first_batches": self.first_batches,
        }


class _FirstBatch:
    """A DataLoader iterator that notes a fingerprint of the first batch it yields."""

    def __init__(self, iterator: Any, observer: Observer) -> None:
        self.iterator, self.observer, self.seen = iterator, observer, False

    def __iter__(self) -> "_FirstBatch":
        return self

    def __len__(self) -> int:
        return len(self.iterator)

    def __next__(self) -> Any:
        batch = next(self.iterator)
        if not self.seen:
            self.seen = True
            self.observer._note_first_batch(batch)
        return batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.iterator, name)


# -- in the notebook: from the ranks' facts to warnings --------------------------------------
def _largest_weight_gap(records: list[dict[str, Any]], only_ddp: bool) -> float | None:
    """Largest |Δ| between ranks over the sampled weights, or None if not comparable."""
    per_rank = [[w for w in r["weights"] if w["in_ddp"] or not only_ddp] for r in records]
    if not per_rank[0] or any(len(ws) != len(per_rank[0]) for ws in per_rank):
        return None
    gap = 0.0
    for groups in zip(*per_rank):
        if any(g["shapes"] != groups[0]["shapes"] for g in groups):
            return None  # different shapes: stages or shards, not replicas
        for tensors in zip(*(g["values"] for g in groups)):
            for values in zip(*tensors):
                finite = [v for v in values if math.isfinite(v)]
                if finite:
                    gap = max(gap, max(finite) - min(finite))
    return gap


def examine(records: dict[int, dict[str, Any]], nproc: int) -> list[str]:
    """Warnings for a launch whose ranks all reported (see the module docstring)."""
    if nproc < 2 or sorted(records) != list(range(nproc)) or any(r.get("broken") for r in records.values()):
        return []
    ranks = [records[rank] for rank in range(nproc)]
    warnings = []
    trained = all(r["steps"] > 0 for r in ranks)
    silent = all(r["collectives_while_training"] == 0 for r in ranks)
    if trained and not any(r["used_ddp"] for r in ranks) and silent:
        gap = _largest_weight_gap(ranks, only_ddp=False)
        if gap is not None and gap > WEIGHT_TOLERANCE:
            if all(r["joined_group"] for r in ranks):
                how = _("ranks ended with different weights: max |Δ| {gap} across {nproc} ranks, and they joined "
                        "a process group but ran no collective while training.")
            else:
                how = _("ranks ended with different weights: max |Δ| {gap} across {nproc} ranks, and they "
                        "ran no collective while training.")
            warnings.append(sentences(how.format(gap=f"{gap:.1e}", nproc=nproc), _(
                "Likely cause: the model was never wrapped in "
                "DistributedDataParallel, so each rank trained its own model and no gradient was averaged. "
                "Fix: model = DDP(model) after init_process_group (lesson 05).")))
    elif trained:
        gap = _largest_weight_gap(ranks, only_ddp=True)
        if gap is not None and gap > WEIGHT_TOLERANCE:
            warnings.append(_(
                "ranks ended with different weights inside DDP: max |Δ| {gap} across {nproc} ranks. "
                "Likely cause: the weights were changed outside DDP's step (edited after wrapping, or an "
                "optimizer built from another copy of the model). Fix: build the optimizer from "
                "ddp_model.parameters() and change weights only through it (lesson 05).").format(gap=f"{gap:.1e}", nproc=nproc))
    if trained and silent and all(r["joined_group"] for r in ranks) and not warnings:
        warnings.append(_(
            "the ranks joined a process group but ran no collective during {steps} "
            "optimizer steps: they never talked while training. Likely cause: the model was not wrapped in "
            "DDP (or the gradients were not all-reduced). Fix: model = DDP(model) (lesson 05).").format(
                steps=min(r["steps"] for r in ranks)))
    repeats = [epochs for epochs in ranks[0]["sampler_epochs"] if len(epochs) > 1 and len(set(epochs)) == 1]
    if repeats:
        warnings.append(_(
            "a shuffling DistributedSampler was iterated {times} times, every time with epoch "
            "{epoch}: each epoch visited the data in the same order. Likely cause: "
            "sampler.set_epoch(epoch) is missing. Fix: call it at the start of every epoch (lesson 04).").format(
                times=len(repeats[0]), epoch=repeats[0][0]))
    writers: dict[str, list[int]] = {}
    for rank, record in enumerate(ranks):
        for path in record["saved_paths"]:
            writers.setdefault(path, []).append(rank)
    shared = {path: who for path, who in writers.items() if len(who) > 1}
    if shared:
        path, who = next(iter(shared.items()))
        warnings.append(_(
            "ranks {ranks} all wrote {file} with torch.save: racing writers can leave a torn file. "
            "Fix: save from rank 0 only (if dist.get_rank() == 0: torch.save(...)), then dist.barrier() "
            "before anyone reads it (lesson 05).").format(ranks=who, file=Path(path).name))
    uncombined = [e for r in ranks for e in r["padded_evaluations"] if r["collectives_at_end"] == e["collectives_before"]]
    if uncombined:
        first = uncombined[0]
        warnings.append(_(
            "evaluation on a DistributedSampler that pads {samples} samples with {padding} "
            "repeats, and the ranks' results were never combined (no collective after it): each rank's "
            "metric covers a quarter of the data, duplicates included. Fix: all-reduce the counts and drop "
            "the padded repeats, or evaluate on one rank (lesson 05).").format(samples=first["dataset"], padding=first["padding"]))
    batches = [r["first_batches"] for r in ranks]
    if any(r["used_ddp"] for r in ranks) and batches[0] and all(b[:1] == batches[0][:1] for b in batches):
        warnings.append(_(
            "all {nproc} ranks trained on the same first batch: every rank reads the whole data set in the same "
            "order, so four cards do the work of one. Likely cause: the DataLoader has no DistributedSampler. "
            "Fix: DataLoader(..., sampler=DistributedSampler(dataset)) (lesson 04).").format(nproc=nproc))
    return warnings
