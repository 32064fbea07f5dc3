"""The default schedule of a product whose stored orders make the plain loop order an
inner product: ``C(i,k) = A(i,j)*B(k,j)`` (``A @ B.T``) on CSR operands.

The loop order that follows every operand's storage (or converts the fewest) puts the
sum over ``j`` inside both output variables, so every pair ``(i, k)`` intersects a row
of A with a row of B: pairs times fiber lengths, quadratic in the extents, whatever
the product's work. Reading the transposed operands the other way round (a copy
converted before each call, ``convert(B)``: linear in its entries, plus a sort) lets
the loops run ``i, j, k``: Gustavson's row workspace over ``k`` for a sparse output,
scattering into the row of a dense one, work linear in the products' multiply-adds.
The model compares the two estimates and says in ``k.cin`` which it chose; with no
statistics (compiling before any call) it takes the linear plan, since the other is
the cliff. A dense output that the plain order writes at a sparse operand's coordinates without
finishing a row first (``A.T @ B`` runs ``j, i, k``, ``A.T @ B.T`` runs ``k, j, i``)
gets the same plan when the estimates favour it: each of its writes lands on another
cache line, and the caller zeroes all of it first, where a row the loops finish is
zeroed by the kernel while it is in cache. A sparse operand over every
output variable (the mask of
``A(i,k)*A(i,j)*B(k,j)``) visits only its own entries, so nothing is changed then.
Where the plain order scatters so but follows storage already (``C.T @ S``, the
gradient of an SDDMM's D: ``i, k, j`` walks each sparse row once per ``k``), the
output's leading variables that no sparse operand reads move innermost while the
output fits in cache, so the sparse operands are walked once, or outermost beyond
(``_one_walk``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ucf.cin.concretize import level_vars
from ucf.cin.notation import CIN
from ucf.format.format import Format
from ucf.lang.ast import Access, accesses, text
from ucf.lang.reductions import peel
from ucf.schedule.commands import Command, Convert, PrecomputeCommand, Reorder
from ucf.schedule.gathering import is_product
from ucf.schedule.multiply_adds import multiply_adds

#: Converting an operand costs about this many steps per stored entry (a counting pass,
#: a scatter, and a sort of each converted fiber).
CONVERT_STEPS = 4.0
#: A write into a dense output across its rows costs about this many steps (a cache line
#: fetched for one entry) against one along a row.
STRIDED_STEPS = 4.0
#: A dense output of up to this many entries (16 MiB of float64, half this machine's L3)
#: takes a column per stored entry of a sparse operand in one walk (``_one_walk``). The
#: gradient of an SDDMM's D, ``grad_D(k,j) = G(i,j)*B(i,j)*C(i,k)`` with G and B CSR,
#: 100k rows of 10, one thread: walking once took 8.5 / 22.5 ms at K = 8 / 16, against
#: 14 / 27 for one walk per k, but 98 against 56 at K = 32 (3.2M entries).
MAX_SCATTERED = 1 << 21


@dataclass
class Linear:
    """A plan linear in the work: its commands and the loop order they leave."""

    commands: list[Command]
    order: list[str]


def plan(cin: CIN, stats, why: list[str], stored: dict[str, Format] | None = None) -> Linear | None:
    """The linear plan for ``cin`` when its plain loop order co-iterates every output
    entry with the intersection of sparse fibers, or scatters into a dense output
    across its rows, and the estimates (or the lack of them) favour it (``stored``:
    the operands' formats as given, where ``cin`` reads some converted); appends to
    ``why`` the line that says which was chosen and why. None where the plain order
    has no such cliff."""
    stmt = cin.statement
    summed, body = peel(stmt.rhs)
    outs = cin.output_vars
    if not summed or not is_product(body) or cin.nested_vars or not outs:
        return None
    found = accesses(body)
    stored = stored or {}
    formats = [stored.get(a.tensor, cin.slots[n].format) for n, a in enumerate(found)]
    sparse = [(a, f) for a, f in zip(found, formats, strict=True) if not f.is_dense]
    if any(set(outs) <= _vars(a) for a, _ in sparse):
        return None  # a mask: only its entries are visited
    order = list(cin.order)
    out_fmt = cin.output_format
    v = outs[out_fmt.mode_order[-1]]
    lead = [outs[m] for m in out_fmt.mode_order[:-1]]
    last_out = max(order.index(w) for w in outs)
    inner = [r for r in summed if order.index(r) > last_out]
    reductions = [r for r in order if r in summed]
    if inner and sum(1 for a, _ in sparse if set(inner) & _vars(a)) >= 2:
        plain = (
            f"the loop order {', '.join(order)} co-iterates every ({', '.join(outs)}) with "
            f"the fibers over {', '.join(inner)}"
        )
        targets = [[*lead, *reductions, v]]
    elif (
        out_fmt.is_dense
        and any(v in _vars(a) for a, _ in sparse)
        and _scatters(order, lead, reductions, v)
    ):
        plain = (
            f"the loop order {', '.join(order)} scatters {stmt.lhs.tensor}'s entries "
            f"across its rows (no row of it stays in cache through the sum over "
            f"{', '.join(reductions)})"
        )
        targets = [[*lead, *reductions, v]]
    else:
        return None
    target, converted = min(
        ((t, _converted(sparse, t)) for t in targets), key=lambda tc: len(tc[1])
    )
    if not converted:
        return _one_walk(cin, stats, why, sparse, lead, target) if out_fmt.is_dense else None
    commands: list[Command] = [Convert(t) for t in converted]
    if target != order:
        commands.append(Reorder(tuple(target)))
    if not out_fmt.is_dense:
        commands.append(PrecomputeCommand(text(body), v, v))
        how = f"Gustavson's row workspace over {v}"
    else:
        how = f"scattering into each row of {stmt.lhs.tensor} over {v}"
    reading = f"reading {', '.join(converted)} converted to the loop order {', '.join(target)}"
    work = _estimates(cin, stats, sparse, inner, converted)
    if work is None:
        why.append(
            f"default: {reading}, {how}: work linear in the product's multiply-adds, where "
            f"{plain} (the extents are unknown before a call)"
        )
        return Linear(commands, target)
    linear, visits = work
    if linear >= visits:
        why.append(
            f"default: {plain}, about {visits:.2g} steps, against about {linear:.2g} for "
            f"{reading}, {how}"
        )
        return None
    why.append(
        f"default: {reading}, {how}: about {linear:.2g} steps (multiply-adds and "
        f"conversions), where {plain}, about {visits:.2g} steps"
    )
    return Linear(commands, target)


def _one_walk(cin: CIN, stats, why: list[str], sparse, lead: list[str], rows: list[str]):
    """The order for a dense output whose leading variables (``lead``) no sparse operand
    reads, when the sparse operands' storage order already holds (``C.T @ S``, the
    gradient of an SDDMM's dense right operand): those variables innermost, so the
    sparse operands are walked once, each stored entry adding into a column of the
    output, while the output (at most ``MAX_SCATTERED`` entries) stays in cache; else
    ``rows`` (the lead variables outermost: one walk per row of the output, which stays
    in cache). The plain order (a walk of each sparse row per lead coordinate, each
    writing another row of the output) loses to both. None without statistics or where
    a sparse operand reads a lead variable."""
    if stats is None or any(set(lead) & _vars(a) for a, _ in sparse):
        return None
    order = list(cin.order)
    names = ", ".join(dict.fromkeys(a.tensor for a, _ in sparse))
    out = cin.statement.lhs.tensor
    entries = math.prod(stats.extents.get(w, 1) for w in cin.output_vars)
    walk = [w for w in order if w not in lead] + lead
    if entries <= MAX_SCATTERED:
        target = walk
        reason = (
            f"walks {names} once in storage order, each stored entry adding into a column of "
            f"{out} over {', '.join(lead)} ({entries} entries, which stay in cache)"
        )
    else:
        target = rows
        reason = (
            f"walks {names} once per {', '.join(lead)}, each walk adding into one row of {out} "
            f"({entries} entries: too many to stay in cache while each stored entry adds "
            "into a column)"
        )
    if target == order:
        return None
    why.append(
        f"default: loop order {', '.join(target)}: {reason}, where the order "
        f"{', '.join(order)} walks each row of {names} once per {', '.join(lead)}"
    )
    return Linear([Reorder(tuple(target))], target)


def _scatters(order: list[str], lead: list[str], reductions: list[str], v: str) -> bool:
    """Whether ``order`` writes a dense output at a sparse operand's coordinates (over
    ``v``) without finishing a row first: its innermost loop runs over a variable of
    the rows (``lead``), or a reduction runs outside one. (An innermost reduction, a
    dot product per entry, writes each entry once.)"""
    pos = {w: k for k, w in enumerate(order)}
    return order[-1] in lead or any(pos[r] < pos[w] for r in reductions for w in lead)


def _converted(sparse, target: list[str]) -> list[str]:
    """The sparse operands the loop order ``target`` walks against their storage."""
    pos = {w: k for k, w in enumerate(target)}
    converted = []
    for a, f in sparse:
        levels = level_vars(a, f, target)
        if any(pos[x] >= pos[y] for x, y in zip(levels, levels[1:], strict=False)):
            converted.append(a.tensor)
    return list(dict.fromkeys(converted))


def _estimates(cin: CIN, stats, sparse, inner, converted) -> tuple[float, float] | None:
    """(the linear plan's steps, the plain plan's): multiply-adds plus ``CONVERT_STEPS``
    per converted entry, against every output entry times the lengths of the sparse
    fibers over ``inner`` it co-iterates, or (nothing inner) the multiply-adds times
    ``STRIDED_STEPS``, each write landing on another cache line."""
    if stats is None or any(a.tensor not in stats.nnz for a, _ in sparse):
        return None
    ext = stats.extents
    found = accesses(peel(cin.statement.rhs)[1])
    products = multiply_adds(found, stats, {a.tensor for a, _ in sparse})
    moved = sum(stats.nnz[t] for t in converted)
    linear = products + CONVERT_STEPS * moved
    if not inner:
        return linear, products * STRIDED_STEPS
    outs = set(cin.output_vars)
    pairs = float(math.prod(ext.get(w, 1) for w in outs))
    per_pair = 0.0
    for a, _ in sparse:
        if set(inner) & _vars(a):
            fixed = math.prod(ext.get(w, 1) for w in _vars(a) if w in outs)
            per_pair += stats.nnz[a.tensor] / max(fixed, 1)
    return linear, pairs * max(per_pair, 1.0)


def _vars(a: Access) -> set[str]:
    return {w for i in a.indices for w in i.variables}
