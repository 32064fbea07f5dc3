"""Partial sums: a long scalar sum kept in one vector register's worth of chains.

A row of SpMV, or SDDMM's dot product over ``k``, sums into one scalar: each step's
fused multiply-add waits for the one before (4 cycles on a Zen 3 core, where the
loads of a step take about one), so the loop runs at the adder's latency, not its
throughput. This pass keeps such a sum in ``P`` partial sums, ``P`` being the lanes of
a 32-byte vector of the sum's type (8 for float32, 4 for float64): of the loop's ``n``
terms, term ``t < P * (n // P)`` goes into partial sum ``t % P`` (the first of them
holding the sum's value before the loop), each partial sum accumulating its terms in
order, one rounding per step as every sum (``ucf.passes.fma``); the partial sums are
then folded in halves, ``s[l] + s[l + P/2]`` for each ``l`` below ``P/2``, until one
is left; the last ``n % P`` terms are added to it in order. A loop of fewer than
``SHORT * P`` terms (16 float64, 32 float32) runs as a single chain, as before; its
own, from 0, added to the sum after the loop, where the sum runs on across an
enclosing loop (see ``_split``). The order depends on nothing but ``n``, the same on
every target and every thread count, so llvm and c agree bit for bit. The copies of one
block of ``P`` terms are independent, so the backends also turn them into vector
instructions where the terms load consecutive elements (a dense dot product).

Only a loop whose trip count comes with the call (a compressed row's positions, a
dense extent) is split, and only when its body is straight-line code whose one
loop-carried value is the sum (a flag set to a constant may ride along, as a sparse
output's hit flag does). A loop with a constant trip count (a block's places, a
fixed-width level's slots, a ``bound``) keeps one chain: the register tiles and row
groups handle those, and they sum each element's terms in loop order.
"""

from __future__ import annotations

import os
from dataclasses import replace

from ucf.errors import UcfError
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import declared, fresh_name, names, substitute, with_blocks
from ucf.passes.tiling import SIZES, VECTOR_BYTES, lanewise, serial_loop, vector_of

#: The element types whose sums are split, with their partial sums per vector.
PARTS = {t: VECTOR_BYTES // SIZES[t] for t in ("f32", "f64")}
#: A loop of fewer than this many times ``P`` terms at the call stays one chain. Out of
#: order, a core overlaps the chains of short rows by itself, and the blocks, the fold
#: and the remainder loop cost more than they save: serial SpMV on rows of about 10
#: (float64) ran 1.13x slower split, on R-MAT's long rows 0.75x (process CPU time,
#: bench/README.md).
SHORT = 4


def enabled() -> bool:
    """Whether the pass runs: ``UCF_PARTIAL_SUMS=0`` keeps every sum one chain, to
    measure what the split gains. The kernel cache keys on it."""
    text = os.environ.get("UCF_PARTIAL_SUMS", "1").strip()
    if text not in ("0", "1"):
        raise UcfError(f"UCF_PARTIAL_SUMS={text!r}: partial sums are 1 (on) or 0 (off)")
    return text == "1"


def split_sums(fn: ir.Function) -> tuple[ir.Function, list[str]]:
    """``fn`` with each long scalar sum kept in partial sums, and a note per loop split
    (for ``k.cin``)."""
    if not enabled():
        return fn, []
    taken = declared(fn.body) | {p.name for p in fn.params}
    notes: list[str] = []
    body = _block(fn.body, taken, notes, None)
    return replace(fn, body=body), notes


def _block(
    stmts: list[ir.Stmt], taken: set[str], notes: list[str], fresh: set[str] | None
) -> list[ir.Stmt]:
    """``stmts`` with their sums split; ``fresh`` names the scalars declared inside the
    innermost enclosing loop (None outside every loop), whose sums start anew at each of
    its iterations."""
    out: list[ir.Stmt] = []
    here = None if fresh is None else set(fresh)
    for s in stmts:
        if isinstance(s, ir.Decl) and here is not None:
            here.add(s.var.name)
        accs, op = _sums_of(s)
        if not accs:
            inner = set() if isinstance(s, ir.For | ir.While) else here
            out.append(with_blocks(s, lambda b, inner=inner: _block(b, taken, notes, inner)))
            continue
        carried = op == "+" and here is not None and all(a.name not in here for a in accs)
        out.extend(_split(s, accs, op, taken, carried))
        label = s.label or s.var.name
        into = ", ".join(a.name for a in accs)
        each = " each" if len(accs) > 1 else ""
        what = "sum" if op == "+" else op
        notes.append(
            f"partial sums: the {what} over {label} into {into} runs in "
            f"{PARTS[accs[0].type]} chains{each}, folded in halves, then the last terms in order"
        )
    return out


def _sums_of(s: ir.Stmt) -> tuple[list[Var], str]:
    """The scalars a loop sums into (or takes the ``max`` or ``min`` into, with the
    term first, as the lowerer writes them), and that operation, when the loop is one
    this pass splits: one scalar, or one per row of a group of rows summed side by side
    (``ucf.passes.row_groups``), each one's terms reading none of them."""
    none: tuple[list[Var], str] = ([], "")
    if not serial_loop(s) or _constant_trips(s):
        return none
    sums: list[ir.Assign] = []
    for b in s.body:
        if isinstance(b, ir.Decl):
            continue
        if not isinstance(b, ir.Assign):
            return none
        if isinstance(b.value, Const):
            continue
        sums.append(b)
    accs = [a.var for a in sums]
    ops = {a.value.op if isinstance(a.value, ir.Bin) else "" for a in sums}
    if not sums or len({a.name for a in accs}) != len(accs) or len({a.type for a in accs}) != 1:
        return none
    if accs[0].type not in PARTS or {a.name for a in accs} & declared(s.body) or len(ops) != 1:
        return none
    (op,) = ops
    carried = {a.name for a in accs}
    values: dict[str, ir.Expr] = {}
    for b in s.body:
        if isinstance(b, ir.Decl):
            values[b.var.name] = substitute(b.init, values)
    for acc, value in ((a.var, a.value) for a in sums):
        if op == "+":
            term = value.right if value.left == acc else value.left if value.right == acc else None
        elif op in ("max", "min"):
            term = value.left if value.right == acc else None
        else:
            return none
        if term is None or carried & names(substitute(term, values)):
            return none
    others = [b for b in s.body if not any(b is a for a in sums)]
    if carried & names(others):
        return none
    flags = {b.var.name for b in others if isinstance(b, ir.Assign)}
    if flags & names(s.body):
        return none  # a flag read in the loop would be loop-carried state
    return accs, op


def _constant_trips(s: ir.For) -> bool:
    if isinstance(s.start, Const) and isinstance(s.end, Const):
        return True
    end = s.end
    return (
        isinstance(end, ir.Bin)
        and end.op == "+"
        and (end.left == s.start and isinstance(end.right, Const))
    )


def _split(s: ir.For, accs: list[Var], op: str, taken: set[str], carried: bool) -> list[ir.Stmt]:
    """The loop ``s`` in partial sums when it is long; when it is short, and ``carried``
    (its sums run on across an enclosing loop: ``s = x'@A@w`` sums every row of A into
    one scalar), its terms go into chains of their own, added to the sums after the
    loop, so the rows' chains overlap instead of forming one chain the length of the
    matrix (1.4x scipy's time at 20,000 rows of 10, bench/chains.py)."""
    parts = PARTS[accs[0].type]
    # Where each partial starts: 0 for a sum (the sum's value before the loop is added
    # at the fold), the maximum's identity for a max (which ignores a NaN, as the scalar;
    # a zero present with both signs may come out with the other sign: docs/design.md).
    first = {"+": 0.0, "max": float("-inf"), "min": float("inf")}[op]

    def fresh(name: str) -> str:
        return fresh_name(name, taken)

    lo = Var(fresh(f"{s.var.name}_lo"), I64)
    n = Var(fresh(f"{s.var.name}_n"), I64)
    blk = Var(fresh(f"{s.var.name}_b"), I64)
    at = Var(fresh(f"{s.var.name}_at"), I64)
    whole = ir.Bin("/", n, Const(parts, I64))
    terms = [_term(s.body, acc) for acc in accs]
    flags = [b for b in s.body if isinstance(b, ir.Assign) and isinstance(b.value, Const)]
    start: list[ir.Stmt] = []
    unrolled: list[ir.Stmt] = []
    partials: list[list[ir.Expr]] = []
    if all(lanewise(term, s.var.name, "") for term in terms):
        for acc, term in zip(accs, terms, strict=True):
            vec = Var(fresh(f"{acc.name}_v"), ir.vector(acc.type, parts))
            lanes = vector_of(term, s.var.name, at, 0, parts, lambda e: e, {})
            start.append(ir.Decl(vec, ir.Splat(Const(first, acc.type), parts)))
            step = ir.Bin("+", vec, lanes) if op == "+" else ir.Bin(op, lanes, vec)
            unrolled.append(ir.Assign(vec, step))
            partials.append([ir.Lane(vec, lane) for lane in range(parts)])
        unrolled += flags
    else:
        sums = {
            acc.name: [Var(fresh(f"{acc.name}_s"), acc.type) for _ in range(parts)] for acc in accs
        }
        start = [ir.Decl(p, Const(first, p.type)) for acc in accs for p in sums[acc.name]]
        for lane in range(parts):
            rename: dict[str, ir.Expr] = {s.var.name: ir.add(at, Const(lane, I64))}
            rename |= {acc.name: sums[acc.name][lane] for acc in accs}
            for b in s.body:
                if isinstance(b, ir.Decl):
                    rename[b.var.name] = Var(fresh(b.var.name), b.var.type)
            unrolled.extend(substitute(s.body, rename))
        partials = [list(sums[acc.name]) for acc in accs]
    folds: list[ir.Stmt] = []
    for acc, partial in zip(accs, partials, strict=True):
        while len(partial) > 1:
            half = len(partial) // 2
            partial = [ir.Bin(op, partial[i], partial[i + half]) for i in range(half)]
        folds.append(
            ir.Assign(
                acc, ir.Bin("+", acc, partial[0]) if op == "+" else ir.Bin(op, partial[0], acc)
            )
        )
    blocks = [ir.Decl(at, ir.add(lo, ir.Bin("*", blk, Const(parts, I64)))), *unrolled]
    split = [
        *start,
        replace(s, var=blk, start=Const(0, I64), end=whole, body=blocks),
        *folds,
        replace(s, start=ir.add(lo, ir.Bin("*", whole, Const(parts, I64)))),
    ]
    long = ir.Cmp(">=", n, Const(SHORT * parts, I64))
    short: list[ir.Stmt] = [s]
    if carried:
        own = {acc.name: Var(fresh(f"{acc.name}_r"), acc.type) for acc in accs}
        short = [
            *(ir.Decl(v, Const(0.0, v.type)) for v in own.values()),
            replace(s, body=substitute(s.body, own)),
            *(ir.Assign(acc, ir.Bin("+", acc, own[acc.name])) for acc in accs),
        ]
    return [ir.Decl(lo, s.start), ir.Decl(n, ir.sub(s.end, lo)), ir.If(long, split, short)]


def _term(body: list[ir.Stmt], acc: Var) -> ir.Expr:
    """What one step adds to ``acc`` (or takes the max or min of it with), with the
    step's declarations put in."""
    values: dict[str, ir.Expr] = {}
    for b in body:
        if isinstance(b, ir.Decl):
            values[b.var.name] = substitute(b.init, values)
        elif isinstance(b, ir.Assign) and b.var == acc:
            v = b.value
            term = v.right if v.left == acc else v.left
            return substitute(term, values)
    raise AssertionError("the loop has no sum")
