"""The default schedule of an elementwise sum whose term intersects sparse operands.

``C(i,j) = A(i,j)*B(i,j) + M(i,j)``, all CSR: the plain nest walks the union of a row
of A, B and M in one loop, comparing three coordinates and branching between the
cases at every entry of any of them, though A*B is present only where both are. A
row workspace for the product (``precompute(A(i,j)*B(i,j), j, j, w)``) runs the
intersection in a loop of its own (two coordinates compared a step), and the
consumer merges the few entries it found with M's row. On 20,000 rows of 10 entries
each, one thread: 3.4 ms a call against 4.6 for the union loop (scipy's
``a.multiply(b) + m``: 2.4), when the output was counted before it was filled; it is
now appended in one pass (``ucf.lower.assembly``): 2.5 ms. The model weighs the two
by ``MERGE_STEPS`` a compared coordinate, still counting the workspace's loops twice
as when they ran twice (a margin for the workspace's own cost; not re-measured), and
says which it chose in ``k.cin``.
"""

from __future__ import annotations

from ucf.cin.notation import CIN
from ucf.lang.ast import accesses, text
from ucf.lang.reductions import peel
from ucf.schedule.commands import Command, PrecomputeCommand
from ucf.schedule.gathering import MERGE_STEPS, row_variable, terms


def intersected(cin: CIN, stats, why: list[str]) -> list[list[Command]]:
    """The plan that precomputes the one term of an elementwise sum (no sum of its own,
    a sparse output) that multiplies two or more sparse operands, each read once, into
    a row workspace; none where the statement is of another shape or the estimate
    favours the union loop. Appends to ``why`` the line that says which was chosen."""
    stmt = cin.statement
    found = terms(stmt.rhs)
    v = row_variable(stmt, cin.output_format)
    if found is None or v is None or peel(stmt.rhs)[0] or cin.output_format.is_dense:
        return []
    formats = {cin.slots[n].tensor: cin.slots[n].format for n in cin.slots}
    read = [[a.tensor for a in accesses(t)] for _, t in found]
    flat = [name for names in read for name in names]
    if any(formats[name].is_dense for name in flat) or len(set(flat)) != len(flat):
        return []
    products = [k for k, names in enumerate(read) if len(names) > 1]
    if len(products) != 1:
        return []
    k = products[0]
    product = text(found[k][1])
    nnz = stats.nnz if stats is not None else {}
    inside = sum(nnz.get(name, 0) for name in read[k])
    outside = sum(nnz.get(name, 0) for names in read[:k] + read[k + 1 :] for name in names)
    union = MERGE_STEPS * (len(flat) - 1) * (inside + outside)
    apart = 2 * (MERGE_STEPS * inside + outside)  # twice: see the module's docstring
    intersect = (
        f"{product} intersected in a loop of its own into a workspace over {v}, the rest "
        "merged with what it found"
    )
    merged = f"one loop over the union of {', '.join(flat)} comparing {len(flat)} coordinates"
    if stats is None:
        why.append(
            f"default: {intersect}, where {merged} would branch between their cases at "
            "every entry of any (the extents are unknown before a call)"
        )
        return [[PrecomputeCommand(product, v, v)]]
    if apart >= union:
        why.append(
            f"default: {merged}, about {union:.2g} steps, against about {apart:.2g} for {intersect}"
        )
        return []
    why.append(
        f"default: {intersect}: about {apart:.2g} steps, where {merged} would take about "
        f"{union:.2g}"
    )
    return [[PrecomputeCommand(product, v, v)]]
