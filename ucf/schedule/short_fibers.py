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

from ucf.cin.notation import CIN
from ucf.lang.ast import accesses
from ucf.schedule.commands import Branchless, Command
from ucf.schedule.multiply_adds import Stats

#: Steps of the branch-free loop.
WIDTH = 4
#: The most entries per fiber, on average, of a walk made branch-free: its stored
#: entries over the fibers it could have (the extents of its other variables).
MEAN = 3.0
#: The most bytes of the dense operands read at the walk's coordinate.
GATHERED = 1 << 18


def plan(cin: CIN, order: list[str], stats: Stats | None) -> tuple[list[Command], list[str]]:
    """``branchless(v, WIDTH)`` for the innermost loop ``v`` of ``order`` where it sums
    (``v`` is not an output variable) over a compressed level of one sparse operand
    whose fibers are short, and every dense operand read at ``v`` is small; with the
    reason. Nothing without a call's ``Stats``."""
    if stats is None or not order:
        return [], []
    v = order[-1]
    if any(v in idx.variables for idx in cin.statement.lhs.indices):
        return [], []
    walked, gathered = None, 0
    for n, a in enumerate(accesses(cin.statement.rhs)):
        fmt = cin.slots[n].format
        names = [idx.single_variable for idx in a.indices]
        if v not in names:
            continue
        if fmt.is_dense:
            gathered += 8 * math.prod(stats.extents.get(w, 0) for w in names if w)
            continue
        last = fmt.mode_order[-1]
        if walked is not None or names[last] != v or fmt.levels[-1].full:
            return [], []
        others = [w for w in names if w != v]
        fibers = math.prod(stats.extents.get(w, 0) for w in others) if all(others) else 0
        walked = stats.nnz.get(cin.slots[n].tensor, 0) / fibers if fibers else None
    if walked is None or walked > MEAN or gathered > GATHERED:
        return [], []
    why = (
        f"default: branchless({v}, {WIDTH}), since the fibers of {v} hold {walked:.1f} "
        f"entries on average and what is read at {v} takes {gathered} bytes"
    )
    return [Branchless(v, WIDTH)], [why]
