"""The default for a sparse vector multiplied into a sparse operand's rows: gather it
into a dense workspace once, instead of merging it with every row.

``y(i) = A(i,j)*x(j)`` with A CSR and x a compressed vector co-iterates each row of A
with the whole of x: a merge per row, ``n_i * nnz(x)`` steps (20,000 rows against 200
entries: 6.4x scipy's ``A @ x``, issue 34). ``precompute(x(j), j, j, w)`` scatters x
into a dense ``w`` over ``j`` once, above the rows (its producer uses no other
variable), and each row then loads ``w`` at its own coordinates: ``n_j + nnz(x)``
steps for the gather, the row's entries for the rest. The model compares the two
estimates (with a call's statistics; without them, gathering is linear and merging
is not, so it gathers) and says which it chose in ``k.cin``.
"""

from __future__ import annotations

import math

from ucf.cin.notation import CIN
from ucf.lang.ast import Access, accesses, text
from ucf.lang.reductions import peel
from ucf.schedule.commands import Command, PrecomputeCommand
from ucf.schedule.gathering import is_product


def plan(cin: CIN, stats, why: list[str]) -> list[Command]:
    """``[precompute(x(j), j, j)]`` for the one sparse vector factor worth gathering,
    or ``[]``; the reason goes into ``why``. ``stats``: a call's ``Stats``, or None."""
    body = peel(cin.statement.rhs)[1]
    if not is_product(body):
        return []
    found = accesses(body)
    for n, a in enumerate(found):
        j = _sparse_vector(cin, n, a)
        if j is None or not _merged_with(cin, found, n, j):
            continue
        outside = cin.order[: cin.order.index(j)]
        if not outside:
            continue  # j outermost: x is merged once already
        if stats is not None:
            rows = math.prod(stats.extents.get(v, 1) for v in outside)
            entries = stats.nnz.get(a.tensor, 0)
            gather = stats.extents.get(j, 0) + entries
            if gather >= rows * entries:
                why.append(
                    f"default: {a.tensor} is merged with each ({', '.join(outside)}) "
                    f"({rows} x {entries} steps), not gathered into a dense workspace over "
                    f"{j} ({gather} steps)"
                )
                return []
        why.append(
            f"default: precompute({text(a)}, {j}, {j}): the sparse vector {a.tensor} is "
            f"gathered into a dense workspace over {j} once, above the loops over "
            f"{', '.join(outside)}, instead of being merged with the entries of each "
            "(linear in its entries, where a merge per row is not)"
        )
        return [PrecomputeCommand(text(a), j, j)]
    return []


def _sparse_vector(cin: CIN, n: int, a: Access) -> str | None:
    """The variable of access ``n`` if it is a vector stored compressed with fill 0."""
    fmt = cin.slots[n].format
    if len(a.indices) != 1 or fmt.fill or fmt.levels[0].full:
        return None
    return a.indices[0].single_variable


def _merged_with(cin: CIN, found: list[Access], n: int, j: str) -> bool:
    """Whether another factor stores ``j`` at a compressed level (so the two merge)."""
    for m, b in enumerate(found):
        if m == n:
            continue
        fmt = cin.slots[m].format
        for kind, mode in zip(fmt.levels, fmt.mode_order, strict=True):
            if not kind.full and b.indices[mode].single_variable == j:
                return True
    return False
