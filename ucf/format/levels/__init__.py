"""Level kinds, one module each, behind the protocol of :mod:`ucf.format.levels.base`.

``KINDS`` maps a format letter to its kind; it is what format strings parse
through, and the only place a new kind is registered.
"""

from ucf.format.levels.base import Checking, LevelKind, Packing
from ucf.format.levels.compressed import COMPRESSED
from ucf.format.levels.dense import DENSE
from ucf.format.levels.singleton import SINGLETON

KINDS: dict[str, LevelKind] = {k.letter: k for k in (DENSE, COMPRESSED, SINGLETON)}

__all__ = ["KINDS", "Checking", "LevelKind", "Packing"]
