"""Tiles that start from zeros in registers instead of from a slice the kernel zeroed:
the first block of a block row writes its rows of the output, and the slice is zeroed
only where that block does not write all of it.

The lowerer zeroes each output slice (``ucf.lower.zeroing``: a row of C for ``i`` of
SpMM, 32 rows for a bcsr(32,32) block row) and the blocks then add into it. The zeros
are one more pass over the output, and every tile of the first block loads them back.
When a loop over blocks (``pA1`` of bcsr SpMM, one step per stored block of the row)
holds a register-blocked nest over every row of a slice and nothing else but
declarations, ``ucf.passes.registers`` gives the nest's tiles a flag (``claim``): set,
they start from zero vectors instead of loading their places. The flag is 0 (the
compiler drops the branch) until ``apply``, after the lowerer has placed its zeroing,
finds the slice's zeroing loop right before that loop over blocks: the flag is then
set on the loop's first step where that step covers the slice, and the zeroing runs
only where it does not (a row without blocks; columns left to the untiled loop; an
output whose rows are not the slice's).

Whether the first step covers the slice is decided at the call, from the extents: the
tiles' first place is the slice's, their rows are one row length apart, their rows
times that length is the slice, and the columns are whole tiles. Each tile's sum is
then ``0 + terms`` in the same order as before, so results are bit for bit those of the
zeroed slice. bcsr(32,32) SpMM 1024^3 float32 (C micro-benchmark of the kernel's loops,
operands evicted before each call, the larger thread's CPU time, loaded 2-core Zen 5):
0.91x the time at 90 % zero blocks and 0.96x at 50 % on 2 threads, 0.92x on one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import declared, fresh_name, names, substitute, with_blocks
from ucf.passes.tiling import Nest, loads_from


@dataclass(frozen=True)
class Claim:
    """A nest's flag, declared (as 0) at the top of the loop over blocks named ``loop``,
    and what its first step writes: ``rows`` rows of ``array``, the first at ``start``,
    ``stride`` apart, each ``span`` places in whole tiles of ``width``."""

    flag: Var
    loop: str
    array: str
    start: ir.Expr
    stride: ir.Expr
    span: ir.Expr
    rows: int
    width: int


def claim(
    fresh: Callable[[str], str],
    loops: list[ir.For],
    nest: Nest,
    original: ir.For,
    base: ir.Expr,
    stride: ir.Expr | None,
    width: int,
) -> Claim | None:
    """A ``Claim`` for ``nest`` (``original`` before the rewrite), if it is the one
    statement, after declarations that do not read its output, of the serial loop
    around it, runs over rows of constant count, and moves one row per ``stride``
    (``base``: its store's place less ``j``, the rows' declarations substituted); else
    None. ``fresh`` names the flag."""
    rows, j = nest.rows, nest.inner
    if not loops or rows is None or stride is None or loops[-1].parallel:
        return None
    body = loops[-1].body
    if [s for s in body if not isinstance(s, ir.Decl | ir.Comment)] != [original]:
        return None
    array = nest.store.array.name
    if any(isinstance(s, ir.Decl) and loads_from(s.init, array) for s in body):
        return None
    if not (isinstance(rows.start, Const) and isinstance(rows.end, Const)):
        return None
    count = int(rows.end.value) - int(rows.start.value)
    if count < 1:
        return None
    start = ir.add(substitute(base, {rows.var.name: rows.start}), j.start)
    span = ir.sub(j.end, j.start)
    flag = Var(fresh("first_block"), I64)
    return Claim(flag, loops[-1].var.name, array, start, stride, span, count, width)


def tile_start(c: Claim | None, acc: Var, load: ir.VLoad) -> tuple[ir.Decl, list[ir.Stmt]]:
    """An accumulator's declaration, and what loads it under ``later``: the tile's place
    in the output, or zeros on the first step of ``c``'s covered slice."""
    if c is None:
        return ir.Decl(acc, load), []
    zero = Const(0.0 if load.array.elem.startswith("f") else 0, load.array.elem)
    return ir.Decl(acc, ir.Splat(zero, load.lanes)), [ir.Assign(acc, load)]


def later(c: Claim) -> ir.Expr:
    """Whether the tiles load their places (every step but the first of a covered slice)."""
    return ir.Cmp("==", c.flag, Const(0, I64))


def apply(fn: ir.Function, claims: list[Claim]) -> tuple[ir.Function, list[str]]:
    """``fn`` with each claimed loop over blocks that follows its slice's zeroing loop
    setting its flag on its first step, and the zeroing run only where that step does
    not cover the slice; and a line per such loop saying so (for ``k.cin``)."""
    if not claims:
        return fn, []
    by_loop = {c.loop: c for c in claims}
    taken = declared(fn.body) | {p.name for p in fn.params}
    notes: list[str] = []

    def block(stmts: list[ir.Stmt]) -> list[ir.Stmt]:
        out: list[ir.Stmt] = []
        at = 0
        while at < len(stmts):
            s = stmts[at]
            after = stmts[at + 1] if at + 1 < len(stmts) else None
            done = _covered(s, after, by_loop, taken)
            if done is not None:
                out += done
                name = by_loop[after.var.name].array.removesuffix("_vals")
                notes.append(
                    f"registers: the tiles of the first step of {after.label or after.var.name} "
                    f"start from zeros and write {name}'s slice, which is zeroed only where "
                    "they do not cover it"
                )
                at += 2
                continue
            out.append(with_blocks(s, block))
            at += 1
        return out

    return replace(fn, body=block(fn.body)), notes


def _covered(
    zero: ir.Stmt, after: ir.Stmt, by_loop: dict[str, Claim], taken: set[str]
) -> list[ir.Stmt] | None:
    """The statements that replace the zeroing loop ``zero`` and the loop over blocks
    ``after``, or None if they are not a slice's zeroing and a claimed loop after it."""
    if not (isinstance(zero, ir.For) and isinstance(after, ir.For) and len(zero.body) == 1):
        return None
    c = by_loop.get(after.var.name)
    store, q = zero.body[0], zero.var
    if c is None or zero.parallel or after.parallel or zero.start != Const(0, I64):
        return None
    if not isinstance(store, ir.Store) or store.accumulate or store.array.name != c.array:
        return None
    if not isinstance(store.value, Const) or store.value.value != 0:
        return None
    index = store.index
    if not (isinstance(index, ir.Bin) and index.op == "+" and index.right == q):
        return None
    marker = ir.Decl(c.flag, Const(0, I64))
    if q.name in names(index.left) or marker not in after.body:
        return None
    covers = [
        ir.Cmp("<", after.start, after.end),
        ir.Cmp("==", c.start, index.left),
        ir.Cmp("==", c.stride, c.span),
        ir.Cmp("==", ir.mul(Const(c.rows, I64), c.stride), zero.end),
        ir.Cmp("==", ir.Bin("%", c.span, Const(c.width, I64)), Const(0, I64)),
    ]
    # a comparison of an expression with itself is left out (C compilers warn of it)
    covers = [x for x in covers if x.left != x.right]
    cond = covers[0]
    for x in covers[1:]:
        cond = ir.Logic("and", cond, x)
    if names(cond) & (declared(after.body) | {after.var.name}):
        return None  # not known before the loop over blocks
    covered = Var(fresh_name("slice_covered", taken), I64)
    one, nil = Const(1, I64), Const(0, I64)
    first = ir.Logic("and", ir.Cmp("==", after.var, after.start), ir.Cmp("!=", covered, nil))
    body = [ir.Decl(c.flag, ir.Select(first, one, nil)) if s == marker else s for s in after.body]
    return [
        ir.Decl(covered, ir.Select(cond, one, nil)),
        ir.If(ir.Cmp("==", covered, nil), [zero]),
        replace(after, body=body),
    ]
