"""Flat passes: a loop over rows whose body only walks each row's positions becomes
one loop over all the positions.

A full sum ``s = A(i,j)`` over a CSR matrix loops over the rows and, in each, over the
row's positions, adding ``A_vals[p]``. With rows of about 10 every row is too short for
partial sums (``ucf.passes.partial_sums``), so the whole sum ran as one chain of adds
waiting on each other's latency, 4.75x numpy's ``A.sum()`` (issue 34), which sums the
flat values array. When the inner loop's body reads nothing of the row it is in (not
the row's index, not anything the row's body declares), the row loop only strings the
rows' position ranges together: row ``i`` walks ``[E(i), E(i+1))`` for a bound ``E``
built of ``pos`` arrays (non-decreasing, as every compressed level's ``pos`` is), so
the rows ``a .. b-1`` walk ``[E(a), E(b))`` in the same order. This pass writes that
one loop. The terms and their order are unchanged; a later pass (partial sums) sees a
loop whose trip count is the tensor's stored entries, not a row's, and splits it.

Applied innermost first, so CSF's three levels flatten to one loop as well. Only serial
loops with nothing but a body are rewritten (a parallel loop's rows are its threads'
work).
"""

from __future__ import annotations

from dataclasses import replace

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.printer import expr
from ucf.ir.walk import names, substitute, with_blocks
from ucf.passes.tiling import serial_loop


def flatten_rows(fn: ir.Function) -> tuple[ir.Function, list[str]]:
    """``fn`` with row loops over position ranges flattened, and a note per loop (for
    ``k.cin``)."""
    pos = {p.name for p in fn.params if p.is_array and p.role[:1] == ("pos",)}
    notes: list[str] = []
    return replace(fn, body=_block(fn.body, pos, notes, set())), notes


def _block(
    stmts: list[ir.Stmt], pos: set[str], notes: list[str], guards: set[int]
) -> list[ir.Stmt]:
    """``guards``: the ids of the guards this pass put around the loops it wrote."""
    out: list[ir.Stmt] = []
    for s in stmts:
        s = with_blocks(s, lambda b: _block(b, pos, notes, guards))
        flat = _flat(s, pos, guards)
        if flat is None:
            out.append(s)
            continue
        out.append(flat)
        guards.add(id(flat))
        inner = flat.then[0]
        notes.append(
            f"flat pass: loop {s.label or s.var.name} only strings together the position "
            f"ranges of loop {inner.label or inner.var.name}, whose body reads nothing of "
            f"its row: one loop over positions [{expr(inner.start)}, {expr(inner.end)})"
        )
    return out


def _flat(s: ir.Stmt, pos: set[str], guards: set[int]) -> ir.If | None:
    """``if (a < b) for p in [E(a), E(b)) body`` for ``for i in [a, b) {lets; for p in
    [E(i), E(i+1)) body}``, when ``body`` reads neither ``i`` nor the lets."""
    if not serial_loop(s) or not s.body:
        return None
    *lets, inner = s.body
    if id(inner) in guards:
        # a flattened loop below: its guard only skips an empty range, so the loop
        # without it walks the same positions
        inner = inner.then[0]
    if not serial_loop(inner) or not all(isinstance(d, ir.Decl) for d in lets):
        return None
    values: dict[str, ir.Expr] = {}
    for d in lets:
        values[d.var.name] = substitute(d.init, values)
    outer = {s.var.name, *values}
    if outer & names(inner.body) or inner.var.name in outer:
        return None
    start, end = substitute(inner.start, values), substitute(inner.end, values)
    i = s.var
    if not _monotone(start, i.name, pos):
        return None
    if substitute(start, {i.name: ir.add(i, Const(1, I64))}) != end:
        return None
    flat = replace(
        inner,
        start=substitute(start, {i.name: s.start}),
        end=substitute(start, {i.name: s.end}),
    )
    return ir.If(ir.Cmp("<", s.start, s.end), [flat])


def _monotone(e: ir.Expr, i: str, pos: set[str]) -> bool:
    """Whether ``e`` is non-decreasing in ``i``: ``i`` itself, or loads of ``pos`` arrays
    (through casts) at such an index."""
    if isinstance(e, Var):
        return e.name == i
    if isinstance(e, ir.Cast):
        return e.type == I64 and _monotone(e.operand, i, pos)
    if isinstance(e, ir.Load):
        return e.array.name in pos and _monotone(e.index, i, pos)
    return False
