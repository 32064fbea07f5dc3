"""Products of 8-bit integers two reduction steps at a time, in register-blocked tiles.

A tile of ``ucf.lower.registers`` over ``C[i, j] += int32(A[i, k]) * int32(B[k, j])``
(int8 weights times uint8 activations into int32) widens each byte of B to int32 and
multiplies 8 lanes at a time: as many multiplies as a float32 tile, so it is no faster
(bench/tesa_formats.py measured 0.84x to 1.15x). x86 has a multiply that does twice
the work on narrow integers: ``pmaddwd`` reads each 32-bit lane of two vectors as two
int16 and adds their two products into that lane as an int32 (``ir.PairDot``; 16
products per AVX2 instruction). Two steps ``k``, ``k + 1`` of the reduction fill the
two halves of a lane:

- before the loop over groups of rows, B's rows ``k`` and ``k + 1`` are packed into a
  panel of int32 words, lane ``j`` holding ``B[k, j]`` in its low half and
  ``B[k + 1, j]`` in its high half, tile after tile as ``registers`` packs float rows;
- A's values of each row at ``k`` and ``k + 1`` make one word the same way, in a small
  panel filled alongside (a tile broadcasts one word per row and pair of steps);
- the tile then runs over pairs of steps, one ``PairDot`` per vector of the tile.

What this gains is bounded by the adds: AVX2 has no integer multiply-accumulate (VNNI's
``vpdpwssd`` fuses the two), so every ``pmaddwd`` takes a ``paddd`` into its accumulator,
and a znver3 core sustains 1.4 to 1.6 such pairs per cycle (22 to 26 multiply-adds,
against 16 for float32's two ``vfmadd231ps``; measured 2026-11-26 in loops of independent
pairs). So the pairs tile peaks at 1.4x to 1.6x the float32 tile, not 2x. On bcsr(32,32)
SpMM at 1024 with 90% of blocks zero (one thread, CPU time) both kernels ran at about
half of their peaks, and pairing B again for each block took about 15% of the int8 call.

An odd number of steps (a block of odd width, or a partial block whose steps are
counted at the call) ends with a pair whose second step is missing: its A half is 0 and
its B half repeats the first step's row, so nothing past the last step is read and the
missing product is 0. Every product of 8-bit integers is exact in int16 x int16 ->
int32, and int32 sums wrap alike in any order, so the result is bit for bit the
widening tile's (numpy's integer product, while it fits). The tile is used only when
the host has AVX2 (both CPU targets compile for the host); elsewhere the widening one.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import llvmlite.binding as llvm

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import names, substitute
from ucf.lower.registers import _SIZES, VECTOR_BYTES, _most, _Nest, _offset, _Rewriter, _trip

#: Element types whose values fit in an int16 half of a lane.
NARROW = ("i8", "u8")
_LOW = 0xFFFF
_HIGH = 1 << 16


@cache
def available() -> bool:
    """Whether the host CPU has AVX2, so that ``PairDot`` is one instruction (the JIT
    compiles for the host, the C target with ``-march=native``). The kernel cache keys
    on it."""
    try:
        return "+avx2" in llvm.get_host_cpu_features().flatten().split(",")
    except RuntimeError:  # a host llvmlite cannot describe
        return False


def paired(
    rewriter: _Rewriter, nest: _Nest, tile: Var, count: ir.Expr, width: int
) -> tuple[_Nest, dict[ir.Load, tuple[ir.Array, ir.Expr]], list[ir.Stmt]] | None:
    """For a nest of ``registers`` over products of 8-bit integers into int32: the nest
    its micro-kernel runs instead (a loop over pairs of steps whose statement adds the
    ``PairDot`` of A's and B's words), the load of that statement which reads the panel
    of B's words (with the place of the tile's row of a pair), and the loops that fill
    both panels. None for any other nest, or without AVX2.

    B is packed even for a single group of rows (a block of 4): on bcsr(4,4) and
    bcsr(4,8) SpMM at 512 (50% of blocks zero) that measured 1.3x and 1.5x faster than
    the widening tile; bcsr(8,8) at 1024 1.6x, bcsr(32,32) 1.7x to 2.2x (one thread)."""
    factors = _factors(nest)
    span = ir.sub(nest.inner.end, nest.inner.start)
    if factors is None or _trip(nest.rows) is None or not names(span) <= rewriter.params:
        return None
    if not available():
        return None
    fixed, varying = factors
    j, red, rows = nest.inner.var.name, nest.red, nest.rows
    half = (_most(red) + 1) // 2
    steps = ir.sub(red.end, red.start)
    even = isinstance(steps, Const) and steps.value % 2 == 0
    if isinstance(steps, Const):
        pairs = _i64((steps.value + 1) // 2)
    else:
        pairs = ir.Bin("/", ir.add(steps, _i64(1)), _i64(2))
    a_panel = _panel(rewriter, fixed, _i64(_trip(rows) * half))
    b_panel = _panel(rewriter, varying, ir.mul(_i64(half * width), ir.Bin("/", span, _i64(width))))

    def steps_of(p: Var) -> tuple[ir.Expr, ir.Expr, ir.Expr | None]:
        """The pair's two steps, the second clamped to the last one, and whether the
        second is one (None: always)."""
        first = ir.add(red.start, ir.mul(p, _i64(2)))
        second = ir.add(first, _i64(1))
        if even:
            return first, second, None
        return first, ir.minimum(second, ir.sub(red.end, _i64(1))), ir.Cmp("<", second, red.end)

    # A's words: one per row of the block and pair of steps.
    row, p = Var(rewriter.fresh(rows.var.name), I64), Var(rewriter.fresh(red.var.name), I64)
    local: dict[str, ir.Expr] = {rows.var.name: row}
    for d in [*nest.row_decls, *nest.red_decls]:
        local[d.var.name] = substitute(d.init, local)
    a = substitute(ir.Cast(fixed, "i32"), local)
    k0, k1, real = steps_of(p)
    low, high = (substitute(a, {red.var.name: k}) for k in (k0, k1))
    if real is not None:
        high = ir.Select(real, high, Const(0, "i32"))
    at = ir.add(ir.mul(ir.sub(row, rows.start), _i64(half)), p)
    words = [ir.Store(a_panel, at, _word(low, high))]
    fill_a = ir.For(row, rows.start, rows.end, [ir.For(p, _i64(0), pairs, words)])

    # B's words: the lanes of a tile at both steps, tile after tile.
    lanes = VECTOR_BYTES // _SIZES["i32"]
    q, t = Var(rewriter.fresh(red.var.name), I64), Var(rewriter.fresh("j_tile"), I64)
    k0, k1, _ = steps_of(q)
    source = _offset(varying.index, j)
    first = ir.add(nest.inner.start, ir.mul(t, _i64(width)))
    copies = []
    for v in range(0, width, lanes):
        low, high = (
            ir.Cast(
                ir.VLoad(
                    varying.array,
                    ir.add(substitute(source, {red.var.name: k}), ir.add(first, _i64(v))),
                    lanes,
                ),
                ir.vector("i32", lanes),
            )
            for k in (k0, k1)
        )
        place = ir.add(ir.mul(ir.add(ir.mul(t, _i64(half)), q), _i64(width)), _i64(v))
        copies.append(ir.Store(b_panel, place, _word(low, high)))
    fill_b = ir.For(q, _i64(0), pairs, [ir.For(t, _i64(0), count, copies)])

    # The micro-kernel's statement: the row's word of A times the tile's words of B.
    pair = Var(rewriter.fresh(f"{red.var.name}_pair"), I64)
    a_word = ir.Load(a_panel, ir.add(ir.mul(ir.sub(rows.var, rows.start), _i64(half)), pair))
    b_row = ir.mul(ir.add(ir.mul(tile, _i64(half)), pair), _i64(width))
    in_tile = ir.sub(ir.sub(Var(j, I64), nest.inner.start), ir.mul(tile, _i64(width)))
    b_word = ir.Load(b_panel, ir.add(b_row, in_tile))
    label = f"{red.label or red.var.name} pairs"
    loop = replace(red, var=pair, start=_i64(0), end=pairs, body=[], label=label)
    kernel = replace(
        nest, red=loop, red_decls=[], store=replace(nest.store, value=ir.PairDot(a_word, b_word))
    )
    rewriter.notes.append(
        f"registers: {red.label or red.var.name} runs in pairs of steps: the 8-bit values of "
        f"{fixed.array.name} and {varying.array.name} paired into {a_panel.name} and "
        f"{b_panel.name} before each {rows.label or rows.var.name} loop, "
        "two products per int32 lane (pmaddwd)"
    )
    return kernel, {b_word: (b_panel, b_row)}, [fill_a, fill_b]


def _factors(nest: _Nest) -> tuple[ir.Load, ir.Load] | None:
    """The loads of a product of two 8-bit integers widened to int32 that the nest
    accumulates into int32: the one that is the same for every ``j``, and the one that
    varies with ``j`` at unit stride, at the reduction's step and the same for every
    row (so a panel of it serves the block's rows)."""
    value, j = nest.store.value, nest.inner.var.name
    if nest.store.array.elem != "i32" or nest.rows is None:
        return None
    if not (isinstance(value, ir.Bin) and value.op == "*"):
        return None
    loads = [
        x.operand
        for x in (value.left, value.right)
        if isinstance(x, ir.Cast)
        and x.type == "i32"
        and isinstance(x.operand, ir.Load)
        and x.operand.array.elem in NARROW
    ]
    if len(loads) != 2:
        return None
    fixed, varying = sorted(loads, key=lambda x: j in names(x.index))
    local = {nest.rows.var.name} | {d.var.name for d in [*nest.row_decls, *nest.red_decls]}
    used = names(varying.index)
    if j in names(fixed.index) or j not in used or nest.red.var.name not in used:
        return None
    if used & local or _offset(varying.index, j) is None:
        return None
    return fixed, varying


def _panel(rewriter: _Rewriter, load: ir.Load, size: ir.Expr) -> ir.Array:
    """A new panel of int32 words for the pairs of ``load``'s values, each thread's."""
    panel = ir.Array(rewriter.fresh(f"{load.array.name.removesuffix('_vals')}_pairs"), "i32")
    rewriter.panels.append(panel)
    rewriter.sizes.append(size)
    return panel


def _word(low: ir.Expr, high: ir.Expr) -> ir.Expr:
    """The int32 (or vector of them) holding ``low`` in its low int16 half and ``high``
    in its high half: both fit in int16, so the sum carries nothing across."""
    n = ir.lanes(low.type)

    def const(value: int) -> ir.Expr:
        c = Const(value, "i32")
        return c if n == 1 else ir.Splat(c, n)

    return ir.add(ir.Bin("&", low, const(_LOW)), ir.Bin("*", high, const(_HIGH)))


def _i64(value: int) -> Const:
    return Const(value, I64)
