"""Level kinds, one module each (COO's pair, compressed and singleton, share one), behind
the protocol of :mod:`ucf.format.levels.base`.

``KINDS`` maps a format letter to its kind; it is what format strings parse
through, and the only place a new kind is registered. A kind whose letter takes a
number (``F4``) is registered without it and given it by ``with_parameter``.
"""

from ucf.format.levels.base import Checking, LevelKind, Packing
from ucf.format.levels.compressed import COMPRESSED, SINGLETON
from ucf.format.levels.dense import DENSE
from ucf.format.levels.fixed import FIXED_WIDTH
from ucf.format.levels.unordered import UNORDERED
from ucf.format.levels.workspace import WORKSPACE_LIST

KINDS: dict[str, LevelKind] = {
    k.letter: k for k in (DENSE, COMPRESSED, SINGLETON, FIXED_WIDTH, UNORDERED, WORKSPACE_LIST)
}

__all__ = ["KINDS", "Checking", "LevelKind", "Packing"]
