"""The reference solutions of the build exercises (fourcard_helpers/exercises), one module per family.

Each is also the text of its lesson's hidden solution cell (tests/process/test_exercises.py keeps them equal),
and each is compared with PyTorch's own implementation in tests/lessons/test_solutions.py.
"""
from .attention import ring_attention
from .clipping import clip_sharded_grad_norm_
from .ddp import BucketedDDP, OverlappedDDP
from .experts import expert_dispatch
from .pipeline import one_f_one_b
from .plans import block_plan
from .recipe import configure_optimizer
from .ring import ring_all_reduce
from .sharding import HandFSDP, ShardedOptimizer
from .tensor_parallel import ColumnParallelLinear, CopyToShards, ReduceFromShards, RowParallelLinear

__all__ = ["OverlappedDDP", "BucketedDDP", "ShardedOptimizer", "HandFSDP", "ring_all_reduce", "one_f_one_b",
           "CopyToShards", "ReduceFromShards", "ColumnParallelLinear", "RowParallelLinear",
           "ring_attention", "expert_dispatch", "block_plan", "clip_sharded_grad_norm_", "configure_optimizer"]
