"""A reference solution for lesson 13's build exercise: the tensor + sequence parallel plan of one GPT
block, for `parallelize_module` (torchtitan's plan, with this course's layer names)."""
from __future__ import annotations

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel


def block_plan():
    """Each block: norms over each card's part of the sequence, one gather before each sub-layer, whole heads and
    MLP columns per card, and each sub-layer's partial sums scattered back over the sequence."""
    parts, whole = (Shard(1),), (Replicate(),)   # the sequence cut over the cards, or whole
    return {
        "attention_norm": SequenceParallel(),   # each card normalises its part of the positions
        "mlp_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=parts, desired_input_layouts=whole),   # one all-gather
        "mlp": PrepareModuleInput(input_layouts=parts, desired_input_layouts=whole),
        "attention.wq": ColwiseParallel(),      # by columns: each card computes whole heads, its own
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),   # partial sums, reduce-scattered over the sequence
        "mlp.w1": ColwiseParallel(),
        "mlp.w2": RowwiseParallel(output_layouts=Shard(1)),
    }
