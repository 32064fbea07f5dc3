"""The default for a large dense operand the loops read against its storage: read a
copy laid out in the order they walk it (``convert(D)`` on a dense operand).

SDDMM ``A(i,j) = B(i,j)*C(i,k)*D(k,j)`` runs ``i, j, k`` whatever D's layout: B's
rows fix i and j, and the dot product over k is innermost. With D row-major each step
of that dot product loads another cache line (a stride of D's width), so every stored
entry of B costs K cache lines where D column-major costs K/8 (float64). Copying D
once per call into the layout the loops walk costs one pass over D (``relaid``, on
the kernel's threads); each of its entries is then read about nnz(B)/N times
contiguously (100k x 100k, 10 a row, K = 64, one thread of Zen 5: 169 ms row-major
against 58 ms column-major, and the copy about 7 ms).

The model copies where the operand is read at least ``REUSE`` times per entry (the
statement's multiply-adds over its size) and is too large for the cache to hide the
stride (``MIN_ENTRIES``). Without a call's statistics it keeps the operand as stored: a
call large enough to gain gets a plan of its own (``cpu_model.REPLAN_WORK``), and a
small one would pay a copy for nothing.
"""

from __future__ import annotations

import math

from ucf.cin.concretize import walked_layout
from ucf.cin.notation import CIN
from ucf.lang.ast import accesses
from ucf.lang.reductions import peel
from ucf.schedule.commands import Command, Convert
from ucf.schedule.gathering import is_product
from ucf.schedule.multiply_adds import Stats, multiply_adds

#: Copy an operand only if the statement reads each of its entries this many times on
#: average: the copy reads and writes each once.
REUSE = 2.0
#: ... and it holds at least this many entries (512 KB of float64): below, it stays in
#: the core's L2 and a strided read costs about as much as a contiguous one.
MIN_ENTRIES = 1 << 16


def plan(cin: CIN, order: list[str], stats: Stats | None, why: list[str]) -> list[Command]:
    """``convert(D)`` for each dense operand that the loops in ``order`` read against
    its storage in their innermost mode, where the copy pays; the reasons go into
    ``why``. ``stats``: a call's ``Stats``, or None (then nothing is copied)."""
    if stats is None:
        return []
    body = peel(cin.statement.rhs)[1]
    if not is_product(body):
        return []
    found = accesses(body)
    sparse = {cin.slots[n].tensor for n in cin.slots if not cin.slots[n].format.is_dense}
    reads = multiply_adds(found, stats, sparse)
    commands: list[Command] = []
    for n, a in enumerate(found):
        slot = cin.slots[n]
        fmt = slot.format
        if slot.name != slot.tensor or a.tensor in sparse:
            continue
        walked = walked_layout(a, fmt, order)
        if walked is None or any(c.tensor == a.tensor for c in commands):
            continue
        ext = [stats.extents.get(i.single_variable, 1) for i in a.indices]
        # Modes of extent 1 take no room: D of one row is a vector either way.
        inner = [[m for m in f.mode_order if ext[m] > 1][-1:] for f in (walked, fmt)]
        if inner[0] == inner[1]:
            continue  # as stored, or strided only in outer loops
        size = math.prod(ext)
        if size < MIN_ENTRIES or reads < REUSE * size:
            continue
        commands.append(Convert(a.tensor))
        why.append(
            f"default: convert({a.tensor}): the loops {', '.join(order)} read dense "
            f"{a.tensor} ('{fmt.name}') along another mode than its storage's, so it is "
            f"copied to '{walked.name}' before each call (about {reads / size:.0f} reads of "
            "each entry, each then contiguous, for one pass over it)"
        )
    return commands
