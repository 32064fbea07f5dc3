"""The operand statistics the default schedule reads at a call (``ucf.schedule.model``).

They must cost next to nothing: extents and stored-entry counts are already at
hand, and the one statistic that reads an array, how unevenly rows are filled,
is kept per ``pos`` array, so calling a kernel again on the same operand does
not read it again.
"""

from __future__ import annotations

import weakref

import numpy as np

from ucf.format.tensor import Tensor
from ucf.schedule.model import Stats

# id(pos) -> (a weak reference to pos, its spread); the reference tells a reused id apart.
_SPREADS: dict[int, tuple[weakref.ref, float]] = {}


def measure(given: dict[str, Tensor], extents: dict[str, int]) -> Stats:
    """Extents per variable, and per sparse operand its stored entries and spread."""
    sparse = {n: t for n, t in given.items() if not t.format.is_dense}
    return Stats(
        dict(extents),
        {n: int(t.vals.size) for n, t in sparse.items()},
        {n: spread(t) for n, t in sparse.items()},
    )


def spread(t: Tensor) -> float:
    """The longest segment of ``t``'s first segmented level below the top, over the
    mean segment (its rows, for CSR): 1.0 for even rows or no such level."""
    pos = next((lv["pos"] for lv in t.levels[1:] if "pos" in lv), None)
    if pos is None or pos.size < 2:
        return 1.0
    hit = _SPREADS.get(id(pos))
    if hit is not None and hit[0]() is pos:
        return hit[1]
    lengths = np.diff(pos)
    mean = float(lengths.mean())
    value = float(lengths.max()) / mean if mean > 0 else 1.0
    if len(_SPREADS) > 256:
        _SPREADS.clear()
    _SPREADS[id(pos)] = (weakref.ref(pos), value)
    return value
