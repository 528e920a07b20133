"""Lesson 13's mesh scripts count what CommDebugMode counts, in a real 2-rank launch."""
from __future__ import annotations

from helpers import NOTEBOOKS

LESSON = next(p for p in NOTEBOOKS if p.stem == "13_gpt_on_four_cards")


MODE_AGAINST_COMMDEBUGMODE = """
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.utils._python_dispatch import TorchDispatchMode
from fourcard_helpers import report
{collectives}
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2,))
a = distribute_tensor(torch.ones(4, 6), mesh, [Shard(0)])
b = distribute_tensor(torch.ones(4, 6), mesh, [Shard(1)])
with CommDebugMode() as debug, Collectives() as counted:
    a + b                                     # the layouts differ: DTensor redistributes inside the operation
    a.redistribute(mesh, [Replicate()])       # an explicit redistribution
    dist.all_reduce(torch.ones(3))            # a plain c10d call
    dist.all_gather_into_tensor(torch.empty(10), torch.ones(5))   # FSDP2's forms: the gathered output...
    dist.reduce_scatter_tensor(torch.empty(7), torch.ones(14))    # ...and the unreduced input are the messages
report(seen=counted.seen, debug={{op.__name__: n for op, n in debug.get_comm_counts().items()}})
dist.destroy_process_group()
"""


def test_the_mesh_scripts_mode_counts_what_commdebugmode_counts() -> None:
    """Section 5's dispatch mode, taken from the shipped script, on two gloo ranks beside PyTorch's CommDebugMode:
    the collective a DTensor operation issues inside itself (an implicit redistribution), an explicit
    redistribution, a plain all-reduce and FSDP2's all-gather and reduce-scatter are counted alike by both, so the
    lesson's 'the optimizer sent nothing' could fail. A mode that ran DTensor's operation itself would miss the
    first one. Each message is sized as the lesson's plan sizes it: a gather whole, whether it is handed one card's
    part (DTensor's) or the whole output (FSDP2's), and a reduce-scatter by its unreduced input."""
    import ast

    from fourcard_helpers.launch import leftover_processes, torchrun

    text = (LESSON.parent / "scripts" / "13_gpt_tp_fsdp2.py").read_text(encoding="utf-8")
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "Collectives")
    script = MODE_AGAINST_COMMDEBUGMODE.format(collectives=ast.get_source_segment(text, node))
    reports = torchrun(script, nproc=2, timeout=180, echo=False).reports
    assert leftover_processes() == []
    for r in (0, 1):
        seen = [op for op, _ in reports[r]["seen"]]
        assert {op: seen.count(op) for op in seen} == reports[r]["debug"], reports[r]
        assert seen.count("all_gather_into_tensor") >= 2 and seen.count("allreduce_") == 1, reports[r]
        sizes = dict(reports[r]["seen"])
        assert sizes["_allgather_base_"] == 10 * 4 and sizes["_reduce_scatter_base_"] == 14 * 4, reports[r]
        assert sizes["all_gather_into_tensor"] == 4 * 6 * 4, reports[r]   # a's whole tensor, not one card's rows
