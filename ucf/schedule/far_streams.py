"""The default for a row walk whose gathers land far apart: ``streams(j, 2)``.

SpMV's walk over a row reads the row's coordinates and values in order, and the
vector ``x`` at the coordinates. ``ucf.passes.streams`` fetches the two streams 6 KB
ahead; into the L1 (x86's ``prefetcht0``), that pays where ``x``'s reads hit the
cache: banded SpMV, 2M rows of 15, one Zen 4 thread, 0.75-0.80x scipy's time with the
prefetch into the L1, 0.86-0.93x with none, 1.4-1.7x into the L2 only. Where the
reads of ``x`` land at random in more than the L1 and L2 hold, the L1 prefetches
cost more than they save: the uniform matrix of bench/peers.py (200k rows of 10, x of
1.6 MB) ran at 1.04-1.16x scipy's time with them, 0.97-1.03x with none and
0.68-0.80x with the streams fetched into the L2 only (``prefetcht1``; the L1 then
takes the lines as the row reads them). Hand-written C kernels, gcc -O3, process CPU
time, load 2.5-4, bench/README.md ("The streams into the L2").

Which matrix a call gets is not known when a kernel is compiled, so the default
decides per call, from where the walked matrix's entries lie
(``ucf.schedule.stats.gathers``): how far from its diagonal (a banded matrix's rows
read ``x`` near where the rows before them did) and over how many columns (R-MAT's
crowd into a few, whose part of ``x`` stays in the cache), in bytes of the operands
read at the coordinate.
"""

from __future__ import annotations

import math
from typing import Protocol

from ucf.cin.notation import CIN
from ucf.schedule.commands import Command, Streams
from ucf.schedule.short_fibers import ITEMSIZE, walk

#: The least reach, in bytes of what is read at the walk's coordinate, of a walk whose
#: streams go into the L2: half of the entries lie further from the diagonal than this.
#: A banded matrix's reach is a few columns, a 2-D five-point stencil's one.
REACH = 1 << 12
#: The least bytes of the columns the entries are spread over (``stats.gathers``), in
#: what is read at the coordinate: fewer, they stay in the L1 and L2 whatever the
#: order of the reads. Uniform rows of 10 with x of 32 KB, A from memory: 0.79x scipy
#: with the L1 prefetch, 0.86x into the L2; x of 128 KB: 0.80x and 0.81x; 512 KB:
#: 0.91x and 0.85x. R-MAT's entries (scale 20) crowd into 12k columns, 99 KB of x:
#: 0.88-0.92x scipy with the L1 prefetch, 0.95-0.96x into the L2 (ucf's kernels).
SPREAD = 1 << 18


class Stats(Protocol):
    """What the gate reads of a call's statistics (``ucf.schedule.stats.Stats``)."""

    extents: dict[str, int]
    itemsize: dict[str, int]
    gathers: dict[str, tuple[float, float]]


def plan(cin: CIN, order: list[str], stats: Stats | None) -> tuple[list[Command], list[str]]:
    """``streams(v, 2)`` for the innermost loop ``v`` of ``order`` where it sums (``v``
    is not an output variable) over the compressed level of one matrix, read as
    stored, whose entries lie ``REACH`` bytes or more from its diagonal (the median)
    and over ``SPREAD`` bytes or more of columns, in bytes of the dense operands read
    at ``v``; with the reason. Nothing without a call's ``Stats``."""
    w = walk(cin, order) if stats is not None else None
    lie = stats.gathers.get(w.tensor) if w is not None and w.stored else None
    if lie is None:
        return [], []
    width = sum(
        stats.itemsize.get(t, ITEMSIZE)
        * math.prod(stats.extents.get(x, 0) for x in names if x and x != w.var)
        for t, names in w.dense
    )
    reach, columns = lie
    if reach * width < REACH or columns * width < SPREAD:
        return [], []
    why = (
        f"default: streams({w.var}, 2), since half of {w.tensor}'s entries lie {reach:.0f} "
        f"or more places from its diagonal, spread over about {columns:.0f} of them, "
        f"{columns * width:.0f} bytes of what is read at {w.var}: those reads miss the L1, "
        f"and its streams go into the L2"
    )
    return [Streams(w.var, 2)], [why]
