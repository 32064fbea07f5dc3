"""The default for a sum over short fibers: ``branchless(k, 4)`` (``ucf.passes.short_sums``).

A sum over the innermost level of a sparse operand whose fibers hold a few entries
each, at random, ends its loop with a branch the core mispredicts about once a fiber;
run branch-free, four steps whatever the length, the fiber costs no misprediction but
up to three discarded steps. That pays only while the steps are cheap: the dense
operand read at the fiber's coordinate must sit in the cache. Where it does not, the
core's speculation past the branch had been overlapping the next fibers' misses, and
the longer branch-free fibers leave fewer of them in flight.

One Zen 5 thread, llvm, process CPU time, load 9, SpMV on 2M rows of Poisson lengths:
mean 2.5 and x of 1000 float64: 0.60x the branching loop's time; mean 1.2: 0.69x;
mean 6: 1.09x (most rows take the loop, and the short ones still pay the steps); mean
2.5 with x of 1M float64 (8 MB): 1.41x; R-MAT (mean 15, x 8 MB): 1.49x. TTV on the
peer run's tensor (fibers of 2.5 on average, c of 8 KB): 0.48x.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from ucf.cin.notation import CIN
from ucf.lang.ast import accesses
from ucf.schedule.commands import Branchless, Command

#: Steps of the branch-free loop.
WIDTH = 4
#: The most entries per fiber, on average, of a walk made branch-free: its stored
#: entries over the fibers the loop visits (``fibers``).
MEAN = 3.0
#: The most bytes of the dense operands read at the walk's coordinate.
GATHERED = 1 << 18
#: The bytes of a value where the call did not say (compiling before any call).
ITEMSIZE = 8


class Stats(Protocol):
    """What the gate reads of a call's statistics (``ucf.schedule.stats.Stats``,
    which imports this)."""

    extents: dict[str, int]
    nnz: dict[str, int]
    fibers: dict[str, int]
    itemsize: dict[str, int]


def fibers(stats: Stats, tensor: str, others: list[str], stored: bool = True) -> int:
    """The fibers a loop over ``tensor``'s last level visits, whose other variables are
    ``others``: the segments of that level where the call counted them and the kernel
    reads ``tensor`` as ``stored`` (not a converted copy), else every fiber it could
    have (the product of their extents).

    The segments, not the fibers it could have: a fiber no level above stores is not
    visited at all, and costs no branch. TTV over B 1000 x 1000 x 1000 stored CCC, a
    fraction of the (i, j) fibers present with Poisson lengths of mean m (one thread,
    llvm, load 6.5): branch-free over the loop 0.45-0.58x at m = 2.5 with 0 to 95 % of
    them absent, and 1.05-1.19x at m = 5 to 10 with 50 to 95 % absent, which the mean
    over every (i, j) (1.2 to 2.5) had made branch-free. Where a level above is dense
    (B stored UUC) the empty fibers are visited, and each costs a branch in either
    form, so they count: branch-free 0.74-0.85x at m = 2.5 with 50 to 95 % empty,
    0.87-1.02x at m = 5 to 10 with 50 to 80 % empty (the mean over the non-empty
    fibers would have refused those at 0.87 and 0.95)."""
    if stored and tensor in stats.fibers:
        return stats.fibers[tensor]
    return math.prod(stats.extents.get(w, 0) for w in others) if all(others) else 0


def short(stats: Stats, tensor: str, others: list[str] = ()) -> bool:
    """Whether ``tensor``'s fibers (those a loop over its last level visits) hold at
    most ``MEAN`` entries on average."""
    n = fibers(stats, tensor, list(others))
    return bool(n) and stats.nnz.get(tensor, 0) <= MEAN * n


@dataclass(frozen=True)
class Walk:
    """The innermost loop of a sum over the last level of one sparse operand: its
    variable, the operand (its name, its index variables in the order written, whether
    the kernel reads it as stored, whether that level is full), and the dense operands
    read at the variable, each with its index variables."""

    var: str
    tensor: str
    names: list[str | None]
    stored: bool
    full: bool
    dense: list[tuple[str, list[str | None]]]


def walk(cin: CIN, order: list[str]) -> Walk | None:
    """The walk of ``order``'s innermost loop, where it sums (its variable is not an
    output variable) over the last level of exactly one sparse operand; else None.
    The defaults for short fibers (here) and far streams (``ucf.schedule.far_streams``)
    read it."""
    if not order:
        return None
    v = order[-1]
    if any(v in idx.variables for idx in cin.statement.lhs.indices):
        return None
    walked, dense = None, []
    for n, a in enumerate(accesses(cin.statement.rhs)):
        slot = cin.slots[n]
        fmt, tensor = slot.format, slot.tensor
        names = [idx.single_variable for idx in a.indices]
        if v not in names:
            continue
        if fmt.is_dense:
            dense.append((tensor, names))
            continue
        if walked is not None or names[fmt.mode_order[-1]] != v:
            return None
        walked = (tensor, names, slot.name == tensor, fmt.levels[-1].full)
    return None if walked is None else Walk(v, *walked, dense)


def plan(cin: CIN, order: list[str], stats: Stats | None) -> tuple[list[Command], list[str]]:
    """``branchless(v, WIDTH)`` for the innermost loop ``v`` of ``order`` where it sums
    (``v`` is not an output variable) over a compressed level of one sparse operand
    whose fibers are short, and every dense operand read at ``v`` is small (its
    values' bytes as the kernel reads them); with the reason. Nothing without a call's ``Stats``."""
    w = walk(cin, order) if stats is not None else None
    if w is None or w.full:
        return [], []
    gathered = sum(
        stats.itemsize.get(t, ITEMSIZE) * math.prod(stats.extents.get(x, 0) for x in names if x)
        for t, names in w.dense
    )
    visited = fibers(stats, w.tensor, [x for x in w.names if x != w.var], w.stored)
    mean = stats.nnz.get(w.tensor, 0) / visited if visited else None
    if mean is None or mean > MEAN or gathered > GATHERED:
        return [], []
    why = (
        f"default: branchless({w.var}, {WIDTH}), since the fibers of {w.var} in {w.tensor} "
        f"hold {mean:.1f} entries on average (over the fibers the loop visits) and what is "
        f"read at {w.var} takes {gathered} bytes"
    )
    return [Branchless(w.var, WIDTH)], [why]
