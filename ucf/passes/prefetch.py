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

A loop over a sparse operand's positions that reads a dense operand's slab at the
coordinate it loads (SDDMM's column ``D(:, j)`` at ``j = B_crd[p]``, stored at
``j * K``; SpMM's row ``B(j, :)``) gets, likewise, a prefetch of each cache line of
the slab ``SLAB_DISTANCE`` steps ahead: the slab is a random place in an operand the
cache does not hold (100k x 100k SDDMM, K = 64, D column-major: 60 to 47 ms, one
thread, process CPU time, gcc -O3, at distances 2, 4 and 8: 53, 48 and 47 ms).
"""

from __future__ import annotations

from dataclasses import replace

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Bin, Const, Var
from ucf.ir.walk import (
    assigned,
    declared,
    fresh_name,
    names,
    nodes,
    statements,
    substitute,
    with_blocks,
)

#: Steps of the outer loop between the prefetch of a row and its walk: B's rows of 10
#: entries measured alike at 2 and 3; farther ones would arrive before the rows between.
DISTANCE = 2
#: Steps between the prefetch of a dense slab and its reads (one dot product of K = 64
#: each: the load of a slab takes several).
SLAB_DISTANCE = 6
#: A cache line, in bytes, and the most lines of one slab prefetched (2 KB: a longer
#: slab's first lines cover the wait, the hardware prefetcher the rest).
LINE = 64
MAX_LINES = 32


def prefetch_rows(fn: ir.Function) -> ir.Function:
    """``fn`` with every indirect inner loop's rows prefetched ``DISTANCE`` steps ahead."""
    taken = declared(fn.body) | {p.name for p in fn.params}
    return replace(fn, body=_block(fn.body, taken))


def _block(stmts: list[ir.Stmt], taken: set[str], outer: ir.For | None = None) -> list[ir.Stmt]:
    out = []
    for s in stmts:
        inside = s if isinstance(s, ir.For) else outer
        s = with_blocks(s, lambda b, inside=inside: _block(b, taken, inside))
        if isinstance(s, ir.For) and s.parallel is None:
            s = _slabs(_ahead(s, taken), taken, _last_end(s, outer))
        out.append(s)
    return out


def _last_end(loop: ir.For, outer: ir.For | None) -> ir.Expr:
    """Where ``loop`` ends at the last step of the loop around it (the end of an
    operand's last row, ``B_pos[n_i]``, for a loop over one row's positions): a bound
    that lets a look-ahead run on into the next rows while staying inside the arrays.
    ``loop.end`` itself where the loop around does not define it plainly."""
    if outer is None or names(loop.end) & assigned(outer.body):
        return loop.end
    end = loop.end
    for d in reversed([d for d in outer.body if isinstance(d, ir.Decl)]):
        end = substitute(end, {d.var.name: d.init})
    end = substitute(end, {outer.var.name: ir.sub(outer.end, Const(1, I64))})
    if names(end) & (declared(outer.body) | {outer.var.name}):
        return loop.end
    return end


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


def _slabs(loop: ir.For, taken: set[str], limit: ir.Expr) -> ir.For:
    """``loop`` with a prefetch of each dense slab its body reads at ``c * stride + ...``,
    where ``c`` is declared at the top of the body as a load at ``loop``'s own step
    (a coordinate) and ``stride`` is the same at every step: the slab at the coordinate
    ``SLAB_DISTANCE`` steps ahead (while that step is below ``limit``, where the
    loop's positions end at its last outer step: into the next rows), a line at a
    time."""
    p = loop.var.name
    if not _sums_per_step(loop):
        return loop
    coords = {}
    for d in loop.body:
        if not isinstance(d, ir.Decl):
            break
        init = d.init.operand if isinstance(d.init, ir.Cast) else d.init
        if isinstance(init, ir.Load) and init.index == loop.var and not init.array.output:
            coords[d.var.name] = d.init
    if not coords:
        return loop
    local = declared(loop.body) | {p}
    slabs: dict[tuple[str, ir.Expr], tuple[ir.Array, str, ir.Expr]] = {}
    for n in nodes(loop.body):
        if not isinstance(n, ir.Load | ir.VLoad) or n.array.output:
            continue
        for term in _terms(n.index):
            if not (isinstance(term, ir.Bin) and term.op == "*"):
                continue
            for c, stride in ((term.left, term.right), (term.right, term.left)):
                if isinstance(c, Var) and c.name in coords and not names(stride) & local:
                    slabs.setdefault((n.array.name, stride), (n.array, c.name, stride))
    if not slabs:
        return loop
    step = ir.add(loop.var, Const(SLAB_DISTANCE, I64))
    fetch: list[ir.Stmt] = []
    ahead: dict[str, Var] = {}
    for array, c, stride in slabs.values():
        if c not in ahead:
            ahead[c] = Var(fresh_name(f"{c}_ahead", taken), I64)
            init = substitute(coords[c], {p: step})
            fetch.append(ir.Decl(ahead[c], ir.cast(init, I64)))
        per_line = max(LINE // ir.ELEMENT_BYTES[array.elem], 1)
        lines = ir.minimum(
            Bin("/", ir.add(stride, Const(per_line - 1, I64)), Const(per_line, I64)),
            Const(MAX_LINES, I64),
        )
        line = Var(fresh_name("line", taken), I64)
        at = ir.add(ir.mul(ahead[c], stride), ir.mul(line, Const(per_line, I64)))
        fetch.append(ir.For(line, Const(0, I64), lines, [ir.Prefetch(array, at)]))
    return replace(loop, body=[ir.If(ir.Cmp("<", step, limit), fetch), *loop.body])


def _sums_per_step(loop: ir.For) -> bool:
    """Whether each step of ``loop`` sums an inner loop into a scalar of its own (SDDMM's
    dot product per stored entry): one chain of dependent adds, which keeps the
    out-of-order window from reaching the next steps' loads, so only a prefetch
    starts them early. Where the inner loop adds into the output's row instead
    (SpMM's ``C(i,:) += A(i,j) * B(j,:)``), the steps are independent and the window
    covers them: there the prefetch cost time (100k rows, N = 8 and 32, one thread:
    3.6 to 6.8 ms and 11.1 to 15.9 ms)."""
    own = declared(loop.body)
    for s in statements(loop.body):
        if isinstance(s, ir.For):
            for t in statements(s.body):
                if isinstance(t, ir.Assign) and t.var.name in own and t.var.name in names(t.value):
                    return True
    return False


def _terms(e: ir.Expr) -> list[ir.Expr]:
    """The addends of an index (``j * K + k`` gives ``j * K`` and ``k``)."""
    if isinstance(e, ir.Bin) and e.op == "+":
        return _terms(e.left) + _terms(e.right)
    return [e]
