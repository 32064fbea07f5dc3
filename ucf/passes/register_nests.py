"""The loop nests register blocking (``ucf.passes.registers``) rewrites, and the shape
of the tiles it cuts them into: a loop ``j`` accumulating into a row of the output at
unit stride, inside a short reduction loop of constant trip count, optionally inside a
loop over rows; how many rows (``ROWS``, ``WIDE_ROWS``) and vectors (``VECTORS``) a tile
takes.

Split out of ``registers``, which rewrites what these recognise: reading a nest needs
none of the rewriter's state, and the tiles' shape (which tests read to size their
operands) stays beside the rule that picks it (``tile_rows``).
"""

from __future__ import annotations

from dataclasses import replace

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import names, nodes, substitute
from ucf.passes.tiling import (
    Nest,
    accumulation,
    lanewise,
    loads_from,
    serial_loop,
    trip_bound,
    trip_count,
)

#: Rows of a tile when a loop of constant trip count runs over the output's rows; and
#: with AVX-512's 32 vector registers: 8 x 2 vectors keep 16 multiply-adds in flight.
#: One bcsr(32,32) block row on a packed 1024-column panel (C micro-benchmark, one Zen 5
#: thread) ran 4 x 2 tiles at 170 GFLOP/s, 4 x 4 at 190, 8 x 2 at 235 to 250 (of 284).
ROWS, WIDE_ROWS = 4, 8


#: Vectors per row of a tile, by its rows: accumulators, the vectors of the factor
#: that varies with ``j`` and a broadcast fit in the 16 vector registers of x86-64
#: (AVX-512's 32 for ``WIDE_ROWS``).
VECTORS = {1: 4, 2: 3, ROWS: 2, WIDE_ROWS: 2}


#: The longest reduction loop a tile runs over: the loop must have a constant trip count
#: (a block's dense places), so the rows of the factor that varies with ``j`` it walks
#: stay in the L1 cache for the tiles that follow. Over a sparse or long reduction
#: (CSR's row, a dense k) each tile would walk it again, reading a few bytes of each
#: row it names, and the original loop, streaming whole rows, is faster.
MAX_REDUCTION = 64


def nest_of(s: ir.For) -> Nest | None:
    """``s`` as a nest register blocking rewrites: a loop over rows around a reduction
    loop, or a reduction loop alone."""
    if not serial_loop(s):
        return None
    opened = _opens(s)
    if opened is None:
        return None
    decls, loop = opened
    nest = _reduction_nest(loop, decls) if tile_rows(s) else None
    if nest is not None:
        nest = replace(nest, rows=s, row_decls=decls)
        row = row_dependent(s, decls)
        bounds = names([nest.red.start, nest.red.end, nest.inner.start, nest.inner.end])
        if not bounds & row and coefficient(row_base(nest), s.var.name) is not None:
            return nest
    return _reduction_nest(s, [])


def _reduction_nest(s: ir.For, outer_decls: list[ir.Decl]) -> Nest | None:
    """``s`` as a reduction loop around an accumulating ``j`` loop."""
    trip = trip_bound(s)
    # one step (the offset of a repeated variable, ucf.cin.diagonals) gains nothing
    if not serial_loop(s) or trip is None or trip > MAX_REDUCTION or trip < 2:
        return None
    opened = _opens(s)
    if opened is None:
        return None
    decls, inner = opened
    found = accumulation(inner)
    if found is None:
        return None
    store, base = found
    local = {s.var.name} | {d.var.name for d in decls}
    if names([base, inner.start, inner.end]) & local:
        return None
    if not lanewise(store.value, inner.var.name, store.array.name):
        return None
    if any(loads_from(d.init, store.array.name) for d in [*decls, *outer_decls]):
        return None
    return Nest(None, [], s, decls, inner, store, base)


def _opens(s: ir.For) -> tuple[list[ir.Decl], ir.For] | None:
    """The body of ``s`` as declarations followed by one loop."""
    body = [x for x in s.body if not isinstance(x, ir.Comment)]
    if not body or not isinstance(body[-1], ir.For):
        return None
    if not all(isinstance(x, ir.Decl) for x in body[:-1]):
        return None
    return body[:-1], body[-1]


def tile_rows(s: ir.For, wide: bool = False) -> int:
    """Rows per tile of a loop over rows: ``ROWS`` (``WIDE_ROWS`` first for AVX-512
    vectors), or 2, dividing its constant trip count; 0 if none does. A trip count known
    only at the call (the rows of a dense factor, ``t`` of ``X(t,d) * W(d,h)``) takes
    ``ROWS``, and its last rows run untiled."""
    trip = trip_count(s)
    if trip is None:
        return ROWS
    for rows in (WIDE_ROWS, ROWS, 2) if wide else (ROWS, 2):
        if trip >= rows and trip % rows == 0:
            return rows
    return 0


def row_dependent(rows: ir.For, decls: list[ir.Decl]) -> set[str]:
    """The row loop's variable and the declarations of its body that read it, or load
    (a load stays where the loop guards it: hoisted above a loop of no rows, it could
    read past an array)."""
    dependent = {rows.var.name}
    for d in decls:
        if names(d.init) & dependent or any(isinstance(n, ir.Load) for n in nodes(d.init)):
            dependent.add(d.var.name)
    return dependent


def row_base(nest: Nest) -> ir.Expr:
    """The store's base with the row loop's declarations substituted."""
    mapping: dict[str, ir.Expr] = {}
    for d in nest.row_decls:
        mapping[d.var.name] = substitute(d.init, mapping)
    return substitute(nest.base, mapping)


def coefficient(e: ir.Expr, v: str) -> ir.Expr | None:
    """``c`` such that ``e`` is ``c * v`` plus terms without ``v``, or None."""
    if v not in names(e):
        return None
    if isinstance(e, Var):
        return Const(1, I64)
    if isinstance(e, ir.Bin) and e.op in "+-*":
        left, right = v in names(e.left), v in names(e.right)
        if left and right:
            return None
        if e.op == "*":
            c = coefficient(e.left if left else e.right, v)
            return None if c is None else ir.mul(c, e.right if left else e.left)
        if left:
            return coefficient(e.left, v)
        return coefficient(e.right, v) if e.op == "+" else None
    return None
