"""The reference solutions of the build exercises (fourcard_helpers/exercises), one module per family.

Each is also the text of its lesson's hidden solution cell (tests/test_exercises.py keeps them equal),
and each is compared with PyTorch's own implementation in tests/test_solutions.py.
"""
from .ddp import BucketedDDP, OverlappedDDP
from .sharding import HandFSDP, ShardedOptimizer

__all__ = ["OverlappedDDP", "BucketedDDP", "ShardedOptimizer", "HandFSDP"]
