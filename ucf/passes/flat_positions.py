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

Applied innermost first, so CSF's three levels flatten to one loop as well. Serial
loops with nothing but a body are rewritten; a parallel loop over rows only where its
rows do not race, are shared out in even blocks, and each step of the inner loop
carries nothing and stores only at its own position (a copy of an operand's structure,
``C(i,j) = 2*A(i,j)``): the flat loop is then shared out over positions instead. Before
that, a counter stepping with a loop's positions from ``S - K`` (the output's position
in such a copy, ``ucf.lower.assembly``) is replaced by the position less ``K``.
"""

from __future__ import annotations

from dataclasses import replace

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.printer import expr
from ucf.ir.walk import assigned, declared, names, nodes, statements, substitute, with_blocks
from ucf.passes.tiling import serial_loop


def flatten_rows(fn: ir.Function) -> tuple[ir.Function, list[str]]:
    """``fn`` with row loops over position ranges flattened, and a note per loop (for
    ``k.cin``)."""
    pos = {p.name for p in fn.params if p.is_array and p.role[:1] == ("pos",)}
    notes: list[str] = []
    return replace(fn, body=_block(fn.body, pos, notes, {})), notes


def _block(
    stmts: list[ir.Stmt], pos: set[str], notes: list[str], guards: dict[int, ir.If]
) -> list[ir.Stmt]:
    """``guards``: the guards this pass put around the loops it wrote, by id, and held:
    a guard an outer loop's flattening drops would otherwise free its id for the next
    statement made, and a loop given it was taken for a guard (``'For' object has no
    attribute 'then'``, the statement fuzz's seed 1 case 272)."""
    out: list[ir.Stmt] = []
    for s in _counted(stmts):
        s = with_blocks(s, lambda b: _block(b, pos, notes, guards))
        flat = _flat(s, pos, guards)
        if flat is None:
            out.append(s)
            continue
        out.append(flat)
        guards[id(flat)] = flat
        inner = flat.then[0]
        notes.append(
            f"flat pass: loop {s.label or s.var.name} only strings together the position "
            f"ranges of loop {inner.label or inner.var.name}, whose body reads nothing of "
            f"its row: one loop over positions [{expr(inner.start)}, {expr(inner.end)})"
            + (", shared out among threads as the rows were" if s.parallel else "")
        )
    return out


def _flat(s: ir.Stmt, pos: set[str], guards: dict[int, ir.If]) -> ir.If | None:
    """``if (a < b) for p in [E(a), E(b)) body`` for ``for i in [a, b) {lets; for p in
    [E(i), E(i+1)) body}``, when ``body`` reads neither ``i`` nor the lets."""
    if not (serial_loop(s) or _parallel_rows(s)) or not s.body:
        return None
    *lets, inner = s.body
    if id(inner) in guards:
        # a flattened loop below: its guard only skips an empty range, so the loop
        # without it walks the same positions
        inner = inner.then[0]
    if not serial_loop(inner) or not all(isinstance(d, ir.Decl) for d in lets):
        return None
    if not _own_positions(inner) or s.parallel is not None and not _independent(inner):
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
        parallel=s.parallel,
        strategy=s.strategy,
        schedule=s.schedule,
        parallel_if=s.parallel_if,
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


def _parallel_rows(s: ir.Stmt) -> bool:
    """A parallel loop whose rows do not race, shared out in even blocks (a chunk of
    rows is no chunk of positions), with nothing but its body."""
    return (
        isinstance(s, ir.For)
        and s.parallel is not None
        and s.strategy == "NoRaces"
        and s.schedule == ("static", 0)
        and not (s.prologue or s.epilogue or s.reduction or s.unroll)
    )


def _own_positions(inner: ir.For) -> bool:
    """Whether every load and store of ``inner``'s steps is at the step's own position
    (``p``, or ``p - K`` for a ``K`` the loop does not compute) or at one place for all
    steps: the values of the
    walked tensor, its coordinates, an output of its structure. A step that gathers
    through a coordinate (``x[A1_crd[p]]``) keeps its rows, whose sums the partial
    sums give a chain each (a sum carried across rows, ``docs/design.md``)."""
    p = inner.var
    mine = declared(inner.body) | {p.name}
    values: dict[str, ir.Expr] = {}
    for b in statements(inner.body):
        if isinstance(b, ir.Decl):
            values[b.var.name] = substitute(b.init, values)
    for n in nodes(inner.body):
        if isinstance(n, ir.Load | ir.Store):
            at = substitute(n.index, values)
            own = (
                not (names(at) & mine)
                or at == p
                or (
                    isinstance(at, ir.Bin)
                    and at.op == "-"
                    and at.left == p
                    and not (names(at.right) & mine)
                )
            )
            if not own:
                return False
        elif isinstance(n, ir.VLoad | ir.Call):
            return False
    return True


def _independent(inner: ir.For) -> bool:
    """Whether the positions of ``inner`` may be shared out among threads as the rows
    were: it carries nothing from one step to the next and adds into nothing (each step
    stores only at its own position, ``_own_positions``), as a copy of the operand's
    structure does (``C(i,j) = 2*A(i,j)``)."""
    for b in statements(inner.body):
        if isinstance(b, ir.Assign) or isinstance(b, ir.Store) and (b.accumulate or b.atomic):
            return False
    return True


def _counted(stmts: list[ir.Stmt]) -> list[ir.Stmt]:
    """``stmts`` with each counter that steps with a loop's positions replaced by the
    position: ``c = S - K; for p in [S, E) {.. use c ..; c = c + 1; ..}`` reads ``p - K``
    where it read ``c`` (the output's position in a copy of an operand's structure,
    ``ucf.lower.assembly``), so the loop carries nothing from step to step."""
    out: list[ir.Stmt] = []
    for k, s in enumerate(stmts):
        if out and isinstance(s, ir.For) and _steps_with(out[-1], s, stmts[k + 1 :]):
            c = out.pop()
            base = c.init.right
            at = next(n for n, b in enumerate(s.body) if isinstance(b, ir.Assign))
            body = substitute(s.body[:at], {c.var.name: ir.Bin("-", s.var, base)})
            s = replace(s, body=[*body, *s.body[at + 1 :]])
        out.append(s)
    return out


def _steps_with(c: ir.Stmt, loop: ir.For, after: list[ir.Stmt]) -> bool:
    """Whether ``c`` is a counter ``S - K`` that ``loop`` over ``[S, E)`` steps by one at
    each position, read only before the step and nowhere after the loop."""
    if not (isinstance(c, ir.Decl) and isinstance(c.init, ir.Bin) and c.init.op == "-"):
        return False
    if c.init.left != loop.start or not serial_loop(loop) and not _parallel_rows(loop):
        return False
    name = c.var.name
    step = ir.Assign(c.var, ir.Bin("+", c.var, Const(1, I64)))
    at = [n for n, b in enumerate(loop.body) if b == step]
    if len(at) != 1 or name in assigned(loop.body[: at[0]] + loop.body[at[0] + 1 :]):
        return False
    if name in names(loop.body[at[0] + 1 :]) or name in names(after):
        return False
    return not (names(c.init.right) & (declared(loop.body) | {loop.var.name}))
