"""PeakMemory: the most bytes of tensors held at once, on the CPU route (the profiler's record)."""
from __future__ import annotations

import torch

from fourcard_helpers import PeakMemory

MiB = 2**20


def test_a_moment_counts_at_the_peak_and_what_is_kept_counts_after() -> None:
    meter = PeakMemory(torch.device("cpu"))
    with meter.phase("kept and a moment"):
        kept = torch.empty(MiB)          # 4 MiB, kept
        moment = torch.ones(2 * MiB)     # 8 MiB, for a moment
        del moment
    with meter.phase("after"):
        more = torch.empty(MiB // 2)     # 2 MiB on top of what is kept
    peaks = meter.peaks()
    assert peaks == {"kept and a moment": 12 * MiB, "after": 6 * MiB}
    del kept, more


def test_the_peak_inside_an_operation_and_its_backward_is_seen() -> None:
    meter = PeakMemory(torch.device("cpu"))
    x = torch.ones(MiB, requires_grad=True)          # 4 MiB
    with meter.phase("backward"):
        (x * 3).sum().backward()                     # x * 3 for a moment, then the gradient, kept
    peaks = meter.peaks()
    assert peaks["backward"] >= 4 * MiB + 4 * MiB     # x and its gradient at least
    assert peaks["backward"] < 4 * MiB + 4 * MiB + 4 * MiB + 1024   # never x, x * 3 and the gradient all at once, here
    assert torch.equal(x.grad, torch.full((MiB,), 3.0))


def test_the_profilers_log_lines_stay_out_of_the_output(capfd) -> None:
    meter = PeakMemory(torch.device("cpu"))
    with meter.phase("one"):
        torch.empty(16)
    meter.peaks()
    assert "profiler_st" not in capfd.readouterr().err


def test_live_bytes_count_what_autograd_keeps_and_what_backward_frees() -> None:
    """LiveTensorBytes against autograd's own list of what it keeps: after forward, the bytes alive beyond the
    parameters and the input are exactly the saved activations (each storage once) and the loss; after backward,
    exactly the gradients and the loss. A tool that missed a saved activation, counted a view twice or missed a
    free would fail one of the two."""
    from fourcard_helpers.memory import LiveTensorBytes

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64), torch.nn.LayerNorm(64))
    x = torch.randn(32, 64)
    held = {p.untyped_storage().data_ptr() for p in model.parameters()} | {x.untyped_storage().data_ptr()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.untyped_storage().data_ptr() not in held:
            saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with LiveTensorBytes() as live:
        live.track([*model.parameters(), x])
        start = live.current
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = model(x).transpose(0, 1).square().mean()   # a view on the way: it holds no bytes of its own
        after_forward = live.current
        loss.backward()
        after_backward = live.current
    assert len(saved) >= 5 and after_forward - start == sum(saved.values()) + loss.untyped_storage().nbytes()
    assert after_backward - start == sum(p.grad.nbytes for p in model.parameters()) + loss.untyped_storage().nbytes()
    assert live.peak >= after_forward


def test_live_bytes_follow_a_storage_resized_in_place() -> None:
    """FSDP2 frees a gathered weight by resizing its storage to nothing and refills it the same way: the next
    operation's count must show both."""
    from fourcard_helpers.memory import LiveTensorBytes

    with LiveTensorBytes() as live:
        weight = torch.ones(MiB)                 # 4 MiB
        weight.untyped_storage().resize_(0)
        torch.zeros(1)                           # any operation: the sizes are read again
        freed = live.current
        weight.untyped_storage().resize_(4 * MiB)
        torch.zeros(1)
        refilled = live.current
    assert (freed, refilled, live.peak) == (0, 4 * MiB, 4 * MiB + 4)   # the one-number results are dropped at once


def test_live_bytes_let_fake_tensors_through_and_count_none() -> None:
    """DTensor infers the shapes of its results by running operations on fake tensors (FakeTensor), with no fake mode
    active; under LiveTensorBytes those operations must run (FSDP2 and parallelize_module do this while they set a
    model up) and count nothing: a fake tensor holds no memory."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from fourcard_helpers.memory import LiveTensorBytes

    fake = FakeTensorMode().from_tensor(torch.ones(MiB))
    with LiveTensorBytes() as live:
        total = (fake + fake).sum()
    assert isinstance(total, FakeTensor) and (live.current, live.peak) == (0, 0)
