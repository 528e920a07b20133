"""Peak memory on a GPU or a CPU: the most bytes of tensors held at once while some code runs."""
from __future__ import annotations

import gc
import os
import sys
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import partial

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 for a moment: the profiler's library logs two lines each time it starts
    and stops (with a time and a process id), which would land in a notebook's stored output."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class PeakMemory:
    """`meter = PeakMemory(device)`, then `with meter.phase(name): ...` around each part of the code to
    measure; `meter.peaks()` ends the measurement and returns {name: the most bytes of tensors held at once
    during that phase, counted from zero when `PeakMemory` was created}.

    Why two routes to one number: a GPU's caching allocator counts its own peak
    (`torch.cuda.max_memory_allocated`, reset as each phase begins). A CPU keeps no such count, but PyTorch's
    profiler, asked to profile memory, records every allocation and free of the thread it runs on, in order;
    their running sum rises and falls with the bytes held, and its highest point in a phase is the phase's
    peak. Only what PyTorch's allocator hands out is counted, and on a CPU only what the calling thread does
    (with the threads PyTorch starts for that thread's work): not what a Python thread of its own does, nor
    gloo's worker threads, which can free a collective's tensors, so measure code that runs on one thread.
    A tensor that exists before `PeakMemory` is created must outlive the measurement: its free would be
    missed (and PyTorch warns) if it was made with no measurement running, or subtracted from a sum that
    never counted it if it was made during an earlier one.
    """

    def __init__(self, device: torch.device) -> None:
        self.device, self._peaks, self._labels, self._profiler = torch.device(device), {}, {}, None
        gc.collect()  # let no tensor from before be freed while we count
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        else:
            self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                    profile_memory=True)
            with _quiet_stderr():
                self._profiler.start()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self._profiler is not None:  # the profiler marks where the phase begins and ends
            label = f"PeakMemory phase {len(self._labels)}"
            self._labels[label] = name
            with torch.profiler.record_function(label):
                yield
            return
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        yield
        torch.cuda.synchronize(self.device)
        self._peaks[name] = torch.cuda.max_memory_allocated(self.device) - self._start

    def peaks(self) -> dict[str, int]:
        if self._profiler is not None:
            with _quiet_stderr():
                self._profiler.stop()
            events = self._profiler.profiler.kineto_results.events()  # the raw record, allocations included
            changes = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
            for event in sorted((e for e in events if e.name() in self._labels), key=lambda e: e.start_ns()):
                held = sum(nbytes for t, nbytes in changes if t < event.start_ns())
                highest = held
                for t, nbytes in changes:
                    if event.start_ns() <= t <= event.end_ns():
                        held += nbytes
                        highest = max(highest, held)
                self._peaks[self._labels[event.name()]] = highest
            self._profiler = None
        return dict(self._peaks)



class LiveTensorBytes(TorchDispatchMode):
    """`with LiveTensorBytes() as live: ...`, then `live.peak`: the most bytes of tensor storages alive at once, counted
    at the dispatcher, which every tensor an operation makes passes through.

    Why not the allocator: a CPU keeps no peak of its own, and its allocation record (PeakMemory's route) holds each
    kernel's scratch buffers too, whose sizes depend on the CPU's instruction set and on oneDNN's choices, so a
    stored output would differ from machine to machine. Here only the tensors that operations return count, each
    storage once (a view or an in-place result adds nothing), from the operation that made it until its last
    reference goes: what autograd keeps for backward counts as long as autograd keeps it. Storages made before the
    mode was entered count only once passed to `track` (the parameters, say). FSDP2 frees and refills its gathered
    weights by resizing their storage in place, which no operation reports, so every storage's size is read again
    after each operation. Operations on tensor subclasses (DTensor) are left to the subclass (NotImplemented): the
    plain operations it runs come here; those on fake tensors (DTensor's shape inference) are run and not counted.
    Left out: the allocator's rounding and caching, and what a library holds outside tensors (gloo's buffers)."""

    def __init__(self) -> None:
        super().__init__()
        self._storages: dict[int, tuple[weakref.ref, int]] = {}  # id(storage): (a weak reference, its bytes last read)
        self.current = self.peak = 0

    def track(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count tensors made before the mode was entered (parameters, optimizer state) for as long as they live."""
        for tensor in tensors:
            self._see(tensor)
        self.peak = max(self.peak, self.current)

    def _see(self, tensor: torch.Tensor) -> None:
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.layout != torch.strided:
            return  # a subclass's own storage is its local tensor's, seen when that was made
        storage = tensor.untyped_storage()  # PyTorch keeps one Python object per storage while the storage lives
        if id(storage) not in self._storages:
            self._storages[id(storage)] = (weakref.ref(storage, partial(self._freed, id(storage))), storage.nbytes())
            self.current += storage.nbytes()

    def _freed(self, key: int, _: weakref.ref) -> None:
        self.current -= self._storages.pop(key)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, FakeTensor) for t in types):  # DTensor infers shapes on fake tensors: they hold no bytes
            return func(*args, **(kwargs or {}))
        if any(t not in (torch.Tensor, torch.nn.Parameter) for t in types):
            return NotImplemented  # a subclass (DTensor) first: the plain operations it runs come back here
        out = func(*args, **(kwargs or {}))
        for key, (ref, nbytes) in list(self._storages.items()):  # resized in place since last read (FSDP2)
            storage = ref()
            if storage is not None and storage.nbytes() != nbytes:
                self._storages[key] = (ref, storage.nbytes())
                self.current += storage.nbytes() - nbytes
        for tensor in pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._see(tensor)
        self.peak = max(self.peak, self.current)
        return out
