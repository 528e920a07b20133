from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel


def block_plan():
    """The plan of one Block for parallelize_module: each name inside the block → its parallel style."""
    raise NotImplementedError
