"""Prefetch the rows an indirect loop will walk a few steps ahead (issue 38, SpGEMM).

Gustavson SpGEMM walks a row of A and, for each of its entries j, B's row j: where
that row starts is read from B's ``pos`` at A's coordinate, so the row's coordinates
and values (12 MB of B on the 100k x 100k benchmark: the L3 cache, not L1 or L2) are
loaded only once the loop reaches it, and the out-of-order window covers about the
current row. Here a loop whose inner loop starts at such a chain of loads gets, at the
top of each step, the inner loop's start for the step ``DISTANCE`` ahead and a prefetch
of every array the inner loop reads at its own position there: the rows arrive while
the current one is summed. On that benchmark (one thread, C target, process CPU time
of both passes, interleaved) it took 8 to 12 % off the call; scipy's product has no
prefetch.

The step ahead is read only while it is inside the outer loop (``p + DISTANCE < end``),
so no load goes past the outer operand's arrays; a prefetch itself never faults.
"""

from __future__ import annotations

from dataclasses import replace

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import declared, fresh_name, names, nodes, substitute, with_blocks

#: Steps of the outer loop between the prefetch of a row and its walk: B's rows of 10
#: entries measured alike at 2 and 3; farther ones would arrive before the rows between.
DISTANCE = 2


def prefetch_rows(fn: ir.Function) -> ir.Function:
    """``fn`` with every indirect inner loop's rows prefetched ``DISTANCE`` steps ahead."""
    taken = declared(fn.body) | {p.name for p in fn.params}
    return replace(fn, body=_block(fn.body, taken))


def _block(stmts: list[ir.Stmt], taken: set[str]) -> list[ir.Stmt]:
    out = []
    for s in stmts:
        s = with_blocks(s, lambda b: _block(b, taken))
        if isinstance(s, ir.For) and s.parallel is None:
            s = _ahead(s, taken)
        out.append(s)
    return out


def _ahead(loop: ir.For, taken: set[str]) -> ir.For:
    """``loop`` with the prefetch of its inner loop's rows, if its body is declarations
    and then a loop whose start is a load at a coordinate loaded at ``loop``'s step."""
    *decls, inner = loop.body or [None]
    if not isinstance(inner, ir.For) or not all(isinstance(d, ir.Decl) for d in decls):
        return loop
    start = inner.start
    for d in reversed(decls):  # the start in terms of the outer loop's variable
        start = substitute(start, {d.var.name: d.init})
    p = loop.var.name
    loads = [n for n in nodes([start]) if isinstance(n, ir.Load)]
    indirect = any(
        isinstance(m, ir.Load) and p in names(m.index)
        for n in loads
        for m in nodes([n.index])
        if m is not n
    )
    if not indirect or any(n.array.output for n in loads):  # only operands, read-only
        return loop
    rows = {
        n.array.name: n.array
        for n in nodes(inner.body)
        if isinstance(n, ir.Load) and n.index == inner.var and not n.array.output
    }
    if not rows:
        return loop
    at = Var(fresh_name(f"{inner.var.name}_ahead", taken), I64)
    step = ir.add(loop.var, Const(DISTANCE, I64))
    fetch = [ir.Decl(at, substitute(start, {p: step}))]
    fetch += [ir.Prefetch(array, at) for array in rows.values()]
    return replace(loop, body=[ir.If(ir.Cmp("<", step, loop.end), fetch), *loop.body])
