"""The work a parallel loop does, estimated before it runs, and the threshold below
which it runs on the calling thread alone (``add_work_thresholds``, after
``ucf.lower.parallel`` has shaped the nest's loops)."""

from __future__ import annotations

import os
from dataclasses import replace

from ucf.errors import UcfError
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import (
    declared,
    loops,
    names,
    statements,
    substitute,
)
from ucf.lower.nest import has_load

#: Estimated work (see ``work_estimate``) below which a parallel loop runs on the calling
#: thread alone, because starting and joining threads would cost more than they save.
#: From ``bench/parallel_threshold.py`` on an idle 2-core machine (2026-11-27): two threads
#: lost to one by at most 10 % at every size (1.07-1.10 at 70 to 1e3 units, where waking
#: the second thread costs a few µs) and won from about 1e4 units (0.87 at 11e3, 0.61 at
#: 1.1e5). On a machine that other processes hold, waking a thread took 0.1 to 8 ms and
#: two threads lost to one up to 1e6 units (the constant was 1 << 20 then); set
#: ``UCF_WORK_THRESHOLD`` there. At 1 << 20 SpMV of 500k nonzeros ran on one thread, and
#: MKL's on two was 1.1-1.8x faster.
WORK_THRESHOLD = 1 << 14


def threshold() -> int:
    """``UCF_WORK_THRESHOLD`` if set (0 makes every parallel loop start its threads, as
    the tests want, to exercise them on small inputs), else WORK_THRESHOLD. It is
    compiled into the code, so the kernel cache keys on it."""
    text = os.environ.get("UCF_WORK_THRESHOLD", "").strip()
    if not text:
        return WORK_THRESHOLD
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise UcfError(f"UCF_WORK_THRESHOLD={text!r}: the work threshold is an integer >= 0")
    return value


def work_threshold(loop: ir.For) -> ir.Expr:
    """The condition under which ``loop`` runs on several threads: its estimated work
    reaches ``threshold()``. The one place a cost model tunes when parallelism pays."""
    return ir.Cmp(">=", work_estimate(loop), Const(threshold(), I64))


def add_work_thresholds(body: list[ir.Stmt]) -> None:
    """Give every CPUThread loop its threshold, once the schedule has shaped the nest."""
    for _, loop in loops(body):
        if isinstance(loop, ir.For) and loop.parallel == "CPUThread":
            loop.parallel_if = work_threshold(loop)


def work_estimate(loop: ir.For) -> ir.Expr:
    """Inner iterations the whole loop runs, as an expression of what is known before it.

    Each iteration counts the trip counts of the first loop nested in it, where those
    are known up front (a dense loop over an extent, or a split's ``min(c, ...)``, which
    counts as c). A nested loop over a compressed level below the loop's own variable
    (``pos[p] .. pos[p+1]`` with ``p`` the loop variable) counts its entries in the
    loop's whole range, ``pos[end] - pos[start]``: rows of very different lengths then
    weigh what they hold. Reading ``pos`` at the ends of the range is safe because the
    loop reads the same entries itself; an empty range counts nothing.

    A split's outer loop (blocks of rows, as the default schedule shares out skewed
    rows) counts as the loop it was split from: the blocks' trip count alone would miss
    the rows' entries and keep a large loop serial.
    """
    local = declared(loop.body) | {loop.var.name}
    # Arrays the loop allocates (per-thread workspaces) do not exist before it either.
    local |= {
        s.array.name for s in statements([*loop.prologue, *loop.body]) if isinstance(s, ir.Alloc)
    }
    loop = _unsplit(loop) or loop
    local |= {loop.var.name}
    trips = _span(loop.start, loop.end)
    work: ir.Expr = _times(trips, _weight(loop.body, local))
    inner = _compressed_child(loop)
    across = None if inner is not None else _across_dense(loop, local)
    if inner is not None:
        pos, child = inner
        work = ir.Bin("+", trips, _below(pos, child, loop.start, loop.end, local))
    elif across is not None:
        passes, (pos, child) = across
        below = _below(pos, child, loop.start, loop.end, local)
        work = ir.Bin("+", trips, ir.Bin("*", passes, below))
    else:
        for pos in _merged_levels(loop):
            work = ir.Bin("+", work, _entries(pos, loop.start, loop.end))
    return work


def _unsplit(outer: ir.For) -> ir.For | None:
    """The loop that ``strip_mine`` split into ``outer`` and the block loop in it, over
    the whole range again; None unless ``outer`` has that shape (its body declares
    ``base = lo + outer * chunk``, then only values, then runs ``inner`` over
    ``min(chunk, hi - base)``, whose body first declares ``x = base + inner``)."""
    body = outer.body
    if len(body) < 2 or not isinstance(body[0], ir.Decl) or not isinstance(body[-1], ir.For):
        return None
    if not all(isinstance(s, ir.Decl) for s in body[1:-1]):
        return None
    base, inner = body[0], body[-1]
    start = base.init
    if not (isinstance(start, ir.Bin) and start.op == "+" and _steps(start.right, outer.var)):
        return None
    end = inner.end
    if not (
        isinstance(end, ir.Bin)
        and end.op == "min"
        and isinstance(end.right, ir.Bin)
        and end.right.op == "-"
        and end.right.right == base.var
        and inner.start == Const(0, I64)
        and inner.body
        and isinstance(inner.body[0], ir.Decl)
        and inner.body[0].init == ir.Bin("+", base.var, inner.var)
    ):
        return None
    return ir.For(inner.body[0].var, start.left, end.right.left, inner.body[1:])


def _steps(e: ir.Expr, var: Var) -> bool:
    """Whether ``e`` is ``var`` or ``var`` times something: a block's offset."""
    return e == var or (isinstance(e, ir.Bin) and e.op == "*" and e.left == var)


def _weight(stmts: list[ir.Stmt], local: set[str]) -> ir.Expr | None:
    """Iterations of the first loop in ``stmts`` and of the first loop in it, and so on,
    while their trip counts are known before the parallel loop; None for none.

    A loop over a range known up front whose first inner loop runs over a compressed
    level below it (``X(t,d) * W(d,h)`` with ``W`` in CSR, parallel over ``t``: each
    ``t`` walks every stored entry of ``W``) counts its own trips plus the entries in
    its whole range, as the parallel loop itself does with a compressed child."""
    for s in stmts:
        if not isinstance(s, ir.For):
            continue
        trips = _known_trips(s, local)
        if trips is None:
            return None
        inner = _compressed_child(s)
        span = _span(s.start, s.end)
        if inner is None or inner[0].name in local or has_load(span) or names(span) & local:
            return _times(trips, _weight(s.body, local))
        pos, child = inner
        return ir.Bin("+", span, _below(pos, child, s.start, s.end, local))
    return None


def _below(pos: ir.Array, child: ir.For, start: ir.Expr, end: ir.Expr, local: set[str]) -> ir.Expr:
    """The work under parent positions ``start .. end`` of a compressed level (``pos``,
    walked by ``child``): its entries, and where ``child`` first walks a compressed level
    of its own, that level's entries under them, and so on down; the deepest level's
    entries times the known trips of the loops under it. A filter-sparse convolution
    (F in UCCC, parallel over m) does its multiply-adds under F's last level, 10-50x the
    first level's entries, and counting only those kept it on one thread."""
    deeper = _compressed_child(child)
    if deeper is None:
        return _times(_entries(pos, start, end), _weight(child.body, local))
    grand_pos, grand = deeper
    first, last = (_as_i64(ir.Load(pos, at)) for at in (start, end))
    return _entries(pos, start, end, _below(grand_pos, grand, first, last, local))


def _entries(pos: ir.Array, start: ir.Expr, end: ir.Expr, under: ir.Expr | None = None) -> ir.Expr:
    """The entries a compressed level holds below positions ``start .. end`` of its
    parent, ``pos[end] - pos[start]`` (plus ``under``, the work below them); 0 for an
    empty range, whose end need not be a valid position."""
    count = ir.Bin("-", _as_i64(ir.Load(pos, end)), _as_i64(ir.Load(pos, start)))
    if under is not None:
        count = ir.Bin("+", count, under)
    return ir.Select(ir.Cmp(">", _span(start, end), Const(0, I64)), count, Const(0, I64))


def _known_trips(loop: ir.For, local: set[str]) -> ir.Expr | None:
    """The loop's trip count, or a bound on it, from what is known before the parallel
    loop: a split's ``min(c, ...)`` counts c, and a loop clipped at both ends,
    ``max(0, ...) .. min(n, ...)`` (an affine access kept inside its tensor), counts n."""
    clipped = loop.start == Const(0, I64) or (
        isinstance(loop.start, ir.Bin)
        and loop.start.op == "max"
        and Const(0, I64) in (loop.start.left, loop.start.right)
    )
    if isinstance(loop.end, ir.Bin) and loop.end.op == "min" and clipped:
        for side in (loop.end.left, loop.end.right):
            if isinstance(side, Const):
                return side
        for side in (loop.end.left, loop.end.right):
            if not has_load(side) and not names(side) & local:
                return side
    span = _span(loop.start, loop.end)
    if has_load(span) or names(span) & local:
        return None
    return span


def _span(start: ir.Expr, end: ir.Expr) -> ir.Expr:
    if start == Const(0, I64):
        return end
    if isinstance(end, ir.Bin) and end.op == "+" and end.left == start:
        return end.right  # a fixed-width segment: start .. start + w
    return ir.Bin("-", end, start)


def _times(a: ir.Expr, b: ir.Expr | None) -> ir.Expr:
    return a if b is None else ir.Bin("*", a, b)


def _as_i64(e: ir.Expr) -> ir.Expr:
    return e if e.type == I64 else ir.Cast(e, I64)


def _across_dense(loop: ir.For, local: set[str]) -> tuple[ir.Expr, tuple] | None:
    """A loop over a range known before ``loop`` that stands between it and the
    compressed level below its variable, with the trips of that loop: the outer loop of
    a split of an output variable moved above the row, as the register tile of SpMM
    (``bound(k, kb, 32, MaxExact); split(kb, kt, kr, 16); reorder(i, kt, j, kr)``) does.
    Each of its iterations walks the row again. Counting the rows alone kept such a
    kernel on one thread: 4.4 ms where 2 threads take 2.4."""
    alias: dict[str, ir.Expr] = {}
    for s in loop.body:
        if isinstance(s, ir.Decl):
            alias[s.var.name] = s.init
            continue
        if not isinstance(s, ir.For):
            return None
        known = {k: v for k, v in alias.items() if not has_load(v) and not names(v) & local}
        bounds = replace(s, start=substitute(s.start, known), end=substitute(s.end, known))
        trips = _known_trips(bounds, local)
        found = _compressed_child(s, loop.var, alias)
        return None if trips is None or found is None else (trips, found)
    return None


def _compressed_child(
    loop: ir.For, var: Var | None = None, outer: dict[str, ir.Expr] | None = None
) -> tuple[ir.Array, ir.For] | None:
    """The first loop directly in ``loop``'s body that runs over ``pos[p] .. pos[p+1]``
    where ``p`` is ``var`` (by default ``loop``'s variable), directly or through
    declarations before it (and ``outer``'s, the enclosing body's)."""
    var = var or loop.var
    alias: dict[str, ir.Expr] = dict(outer or {})
    for s in loop.body:
        if isinstance(s, ir.Decl):
            alias[s.var.name] = s.init
            continue
        if not isinstance(s, ir.For):
            continue
        lo, hi = _strip_cast(s.start), _strip_cast(s.end)
        if not (isinstance(lo, ir.Load) and isinstance(hi, ir.Load) and lo.array == hi.array):
            return None
        if hi.index != ir.Bin("+", lo.index, Const(1, I64)):
            return None
        return (lo.array, s) if _resolved(lo.index, alias) == var else None
    return None


def _merged_levels(loop: ir.For) -> list[ir.Array]:
    """The ``pos`` arrays of the compressed levels that a co-iteration ``while`` in
    ``loop``'s body merges below the loop's variable (``pA1 = A1_pos[i]``, ``pA1_end =
    A1_pos[i + 1]``, and B's likewise, for ``A(i,j) + B(i,j)``): each row's merge steps
    through the entries of all of them, so a sparse add of long rows is not counted as
    its rows alone. Empty when the body runs no ``while``."""
    if not any(isinstance(s, ir.While) for s in loop.body):
        return []
    alias: dict[str, ir.Expr] = {}
    starts: dict[str, ir.Expr] = {}
    merged: list[ir.Array] = []
    for s in loop.body:
        if not isinstance(s, ir.Decl):
            continue
        alias[s.var.name] = s.init
        load = _strip_cast(s.init)
        if not isinstance(load, ir.Load):
            continue
        if _resolved(load.index, alias) == loop.var:
            starts[load.array.name] = load.index
        elif starts.get(load.array.name) is not None and load.index == ir.Bin(
            "+", starts[load.array.name], Const(1, I64)
        ):
            merged.append(load.array)
    return merged


def _resolved(p: ir.Expr, alias: dict[str, ir.Expr]) -> ir.Expr:
    """``p`` through the declarations of the loop body before it (``pA0 = i``)."""
    while isinstance(p, Var) and p.name in alias:
        p = alias[p.name]
    return p


def _strip_cast(e: ir.Expr) -> ir.Expr:
    return e.operand if isinstance(e, ir.Cast) else e
