"""The warm session's public face: `from fourcard_helpers.ranks import RankSession, RanksMagics`.

The benchmark of the warm session (benchmarks/warm_session.py) and its tests import these names from
here, where the `%ranks` magic's name leads a reader. The session itself is in warm_session.py, what
runs on each rank in warm_rank_side.py, the ranks' processes in warm_engines.py and the magics in
warm_magics.py; this module defines nothing.
"""
from __future__ import annotations

from .warm_magics import RanksMagics
from .warm_session import RankSession, RankSessionError

__all__ = ["RankSession", "RankSessionError", "RanksMagics"]
