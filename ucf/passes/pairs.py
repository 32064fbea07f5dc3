"""Products of 8-bit integers two or four reduction steps at a time, in register-blocked tiles.

A tile of ``ucf.passes.registers`` over ``C[i, j] += int32(A[i, k]) * int32(B[k, j])``
(int8 weights times uint8 activations into int32) widens each byte of B to int32 and
multiplies 8 lanes at a time: as many multiplies as a float32 tile, so it is no faster
(bench/tesa_formats.py measured 0.84x to 1.15x). x86 has multiplies that do more work
on narrow integers in each 32-bit lane:

- ``pmaddwd`` (AVX2) reads each lane of two vectors as two int16 and adds their two
  products into that lane as an int32 (``ir.PairDot``; 16 products per instruction);
- ``vpdpbusd`` (AVX-512 VNNI with AVX-512VL, or AVX-VNNI) reads each lane as four
  bytes, unsigned in one vector and signed in the other, and adds their four products
  to an accumulator (``ir.QuadDot``; 32 products and the sum per instruction). It fits
  int8 times uint8 and uint8 times int8 (the uint8 side is the unsigned operand); other
  mixes of signs take pairs.

``n`` steps ``k .. k + n - 1`` of the reduction (a pair, or a quad where the host has
VNNI) fill the ``n`` parts of a lane:

- before the loop over groups of rows, B's rows ``k .. k + n - 1`` are packed into a
  panel of int32 words, lane ``j`` holding ``B[k, j]`` in its lowest part and
  ``B[k + n - 1, j]`` in its highest, tile after tile as ``registers`` packs float rows;
- A's values of each row at those steps make one word the same way, in a small panel
  filled alongside (a tile broadcasts one word per row and group of steps);
- the tile then runs over groups of steps, one ``PairDot`` or ``QuadDot`` per vector of
  the tile.

A number of steps that ``n`` does not divide (a block of odd width, or a partial block
whose steps are counted at the call) ends with a group whose last steps are missing:
their A parts are 0 and their B parts repeat the last step's row, so nothing past the
last step is read and the missing products are 0. Every product of 8-bit integers is
exact in int32, and int32 sums wrap alike in any order, so the result is bit for bit the
widening tile's (numpy's integer product, while it fits). Pairs are made only when the
host has AVX2, quads only when it has VNNI (both CPU targets compile for the host);
elsewhere the widening tile. The code generators expand ``QuadDot`` exactly into plain
products and sums for a CPU without VNNI (a saved C kernel built for another CPU).

What this gains is bounded by the adds: AVX2 has no integer multiply-accumulate (VNNI's
``vpdpwssd`` fuses the two), so every ``pmaddwd`` takes a ``paddd`` into its accumulator,
and a znver3 core sustains 1.4 to 1.6 such pairs per cycle (22 to 26 multiply-adds,
against 16 for float32's two ``vfmadd231ps``; measured 2026-11-26 in loops of independent
pairs). So the pairs tile peaks at 1.4x to 1.6x the float32 tile, not 2x. On bcsr(32,32)
SpMM at 1024 with 90% of blocks zero (one thread, CPU time) both kernels ran at about
half of their peaks, and pairing B again for each block took about 15% of the int8 call.

Quads have no such bound: ``vpdpbusd`` adds into its accumulator itself, and a Zen 5
core runs two a cycle at either width, as many as ``vfmadd231ps`` (8.2 a ns each, loops
of 16 independent chains in registers, 2026-11-29): 64 multiply-adds per 512-bit
instruction against float32's 16, a peak 4x float32's. Where the host has AVX-512
VNNI the quads tile is therefore as wide as the float tiles there (``quad_bytes``). On
bcsr(32,32) SpMM at 1024 with 90% of blocks zero (one thread, CPU time, load 8 on 2
cores) the int8 call took 0.31 ms against float32's 0.97 ms: 0.05 ms is the call and
writing C (4 MB of int32, as float32's), about 0.045 ms packing B's quads for each block
(the call without it: 0.265 ms), and the rest the tiles at about 500 GMAC/s, near the
instruction's peak of 530.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import names, substitute
from ucf.passes import panels
from ucf.passes.tiling import (
    VECTOR_BYTES,
    WIDE_BYTES,
    Nest,
    TileState,
    host_features,
    trip_bound,
    trip_count,
    unit_offset,
)

#: Element types whose values fit in an int16 half of a lane, and in a byte of it.
NARROW = ("i8", "u8")
#: The multiplies ``available`` names, as x86 does.
PMADDWD, VPDPBUSD = "pmaddwd", "vpdpbusd"


@cache
def available() -> tuple[str, ...]:
    """The multiplies of 8-bit integers the host runs as one instruction per vector:
    ``pmaddwd`` where it has AVX2, and ``vpdpbusd`` too where it has ``vnni`` (the JIT
    compiles for the host, the C target with ``-march=native``). The kernel cache keys
    on it; tests replace it to make quads on a host without VNNI, whose code generators
    then expand ``QuadDot`` into plain products and sums."""
    features = host_features()
    if "+avx2" not in features.split(","):
        return ()
    return (PMADDWD, VPDPBUSD) if vnni(features) else (PMADDWD,)


def quad_bytes() -> int:
    """The width of the vectors of a quads tile: ``WIDE_BYTES`` where the host runs
    ``vpdpbusd`` on 512-bit vectors (AVX-512 VNNI), as the float tiles take them on an
    AVX-512 host; else ``VECTOR_BYTES``. On 256-bit vectors beside float32's 512-bit
    tiles, bcsr(32,32) SpMM at 1024 (90 % of blocks zero, one Zen 5 thread) ran at 1.85x
    float32, though each ``vpdpbusd`` does four times the multiply-adds of a
    ``vfmadd231ps`` of the same width. The kernel cache keys on it."""
    return WIDE_BYTES if VPDPBUSD in available() and _avx512_vnni() else VECTOR_BYTES


@cache
def _avx512_vnni() -> bool:
    return vnni512(host_features())


def quads(nest: Nest) -> bool:
    """Whether ``paired`` makes quads of the nest's products (int8 times uint8 on a
    VNNI host), whose tile ``registers`` then cuts ``quad_bytes`` wide."""
    factors = _factors(nest)
    if factors is None or VPDPBUSD not in available():
        return False
    return {f.array.elem for f in factors} == {"i8", "u8"}


def vnni512(features: str) -> bool:
    """Whether a CPU with ``features`` runs ``vpdpbusd`` on 512-bit vectors (AVX-512
    VNNI, which implies AVX-512F)."""
    return "+avx512vnni" in features.split(",")


def vnni(features: str) -> bool:
    """Whether a CPU with ``features`` (LLVM's spelling, ``+avx2,-avx512vnni,...``) runs
    ``vpdpbusd`` on 256-bit vectors: AVX-512 VNNI with AVX-512VL, or AVX-VNNI (its VEX
    form, which LLVM selects for the same intrinsic)."""
    on = set(features.split(","))
    return {"+avx512vnni", "+avx512vl"} <= on or "+avxvnni" in on


def paired(
    rewriter: TileState, nest: Nest, tile: Var, count: ir.Expr, width: int, lanes: int
) -> tuple[Nest, dict[ir.Load, tuple[ir.Array, ir.Expr]], list[ir.Stmt]] | None:
    """For a nest of ``registers`` over products of 8-bit integers into int32: the nest
    its micro-kernel runs instead (a loop over groups of steps whose statement adds the
    ``PairDot`` or ``QuadDot`` of A's and B's words), the load of that statement which
    reads the panel of B's words (with the place of the tile's row of a group), and the
    loops that fill both panels. None for any other nest, or without AVX2.

    B is packed even for a single group of rows (a block of 4): on bcsr(4,4) and
    bcsr(4,8) SpMM at 512 (50% of blocks zero) pairs measured 1.3x and 1.5x faster than
    the widening tile; bcsr(8,8) at 1024 1.6x, bcsr(32,32) 1.7x to 2.2x (one thread)."""
    factors = _factors(nest)
    span = ir.sub(nest.inner.end, nest.inner.start)
    if factors is None or trip_count(nest.rows) is None or not names(span) <= rewriter.params:
        return None
    if not available():
        return None
    fixed, varying = factors
    signs = {fixed.array.elem, varying.array.elem}
    n = 4 if VPDPBUSD in available() and signs == {"i8", "u8"} else 2
    word = _word if n == 2 else _bytes
    j, red, rows = nest.inner.var.name, nest.red, nest.rows
    per_row = (trip_bound(red) + n - 1) // n
    steps = ir.sub(red.end, red.start)
    whole = isinstance(steps, Const) and steps.value % n == 0
    if isinstance(steps, Const):
        groups = _i64((steps.value + n - 1) // n)
    else:
        groups = ir.Bin("/", ir.add(steps, _i64(n - 1)), _i64(n))
    kind = "pairs" if n == 2 else "quads"
    a_panel = _panel(rewriter, fixed, kind, _i64(trip_count(rows) * per_row))
    length = ir.mul(_i64(per_row * width), ir.Bin("/", span, _i64(width)))
    cached = panels.cache_key(rewriter, [varying], {}, {j, red.var.name}, red)
    slots, fits = _i64(1), None
    if cached is not None:  # as many slots as the coordinate has values, as the cache holds
        fits, slots = panels.cache_slots(rewriter, cached[1], ir.mul(length, _i64(4)))
    # a cached panel is read only where filled (the tagged slot's)
    b_panel = _panel(rewriter, varying, kind, ir.mul(slots, length), fits, cached is None)

    def steps_of(p: Var) -> list[tuple[ir.Expr, ir.Expr | None]]:
        """The group's steps, each after the first clamped to the last one, with whether
        it is one (None: always)."""
        first = ir.add(red.start, ir.mul(p, _i64(n)))
        out: list[tuple[ir.Expr, ir.Expr | None]] = [(first, None)]
        for i in range(1, n):
            k = ir.add(first, _i64(i))
            if whole:
                out.append((k, None))
            else:
                out.append((ir.minimum(k, ir.sub(red.end, _i64(1))), ir.Cmp("<", k, red.end)))
        return out

    # A's words: one per row of the block and group of steps.
    row, p = Var(rewriter.fresh(rows.var.name), I64), Var(rewriter.fresh(red.var.name), I64)
    local: dict[str, ir.Expr] = {rows.var.name: row}
    for d in [*nest.row_decls, *nest.red_decls]:
        local[d.var.name] = substitute(d.init, local)
    a = substitute(ir.Cast(fixed, "i32"), local)
    parts = []
    for k, real in steps_of(p):
        part = substitute(a, {red.var.name: k})
        parts.append(part if real is None else ir.Select(real, part, Const(0, "i32")))
    at = ir.add(ir.mul(ir.sub(row, rows.start), _i64(per_row)), p)
    words = [ir.Store(a_panel, at, word(parts))]
    fill_a = ir.For(row, rows.start, rows.end, [ir.For(p, _i64(0), groups, words)])

    # B's words: the lanes of a tile at the group's steps, tile after tile; in the slot of
    # the call's cache of the block's coordinate, where there is one.
    slot = base = None
    if cached is not None:
        slot, base = Var(rewriter.fresh("quads_slot"), I64), Var(rewriter.fresh("quads_at"), I64)
    q, t = Var(rewriter.fresh(red.var.name), I64), Var(rewriter.fresh("j_tile"), I64)
    source = unit_offset(varying.index, j)
    first = ir.add(nest.inner.start, ir.mul(t, _i64(width)))
    copies = []
    for v in range(0, width, lanes):
        parts = [
            ir.Cast(
                ir.VLoad(
                    varying.array,
                    ir.add(substitute(source, {red.var.name: k}), ir.add(first, _i64(v))),
                    lanes,
                ),
                ir.vector("i32", lanes),
            )
            for k, _ in steps_of(q)
        ]
        at = ir.add(ir.mul(ir.add(ir.mul(t, _i64(per_row)), q), _i64(width)), _i64(v))
        copies.append(ir.Store(b_panel, at if base is None else ir.add(base, at), word(parts)))
    fill_b: list[ir.Stmt] = [ir.For(q, _i64(0), groups, [ir.For(t, _i64(0), count, copies)])]
    where = f"before each {rows.label or rows.var.name} loop"
    if cached is not None:
        fill_b = _cached(rewriter, fill_b, cached[0], slot, slots, base, length, fits)
        mb = panels.TEAM_BYTES >> 20
        who = "thread" if fits is None else f"team (where the words exceed {mb} MB, thread)"
        where = (
            f"once per call and {who} for each {cached[0].name} ({varying.array.name}), "
            f"before each {rows.label or rows.var.name} loop ({fixed.array.name})"
        )

    # The micro-kernel's statement: the row's word of A times the tile's words of B.
    group = Var(rewriter.fresh(f"{red.var.name}_{kind[:-1]}"), I64)
    a_word = ir.Load(a_panel, ir.add(ir.mul(ir.sub(rows.var, rows.start), _i64(per_row)), group))
    b_row = ir.mul(ir.add(ir.mul(tile, _i64(per_row)), group), _i64(width))
    b_row = b_row if base is None else ir.add(base, b_row)
    in_tile = ir.sub(ir.sub(Var(j, I64), nest.inner.start), ir.mul(tile, _i64(width)))
    b_word = ir.Load(b_panel, ir.add(b_row, in_tile))
    if n == 2:
        value, how = ir.PairDot(a_word, b_word), "two products per int32 lane (pmaddwd)"
    else:
        unsigned, signed = (a_word, b_word) if fixed.array.elem == "u8" else (b_word, a_word)
        value = ir.QuadDot(unsigned, signed, Const(0, "i32"))
        how = "four products per int32 lane (vpdpbusd)"
    label = f"{red.label or red.var.name} {kind}"
    loop = replace(red, var=group, start=_i64(0), end=groups, body=[], label=label)
    kernel = replace(nest, red=loop, red_decls=[], store=replace(nest.store, value=value))
    rewriter.notes.append(
        f"registers: {red.label or red.var.name} runs in {kind} of steps: the 8-bit values of "
        f"{fixed.array.name} and {varying.array.name} packed {n} to a word into "
        f"{a_panel.name} and {b_panel.name} {where}, " + how
    )
    return kernel, {b_word: (b_panel, b_row)}, [fill_a, *fill_b]


def _cached(
    rewriter: TileState,
    fill: list[ir.Stmt],
    coordinate: Var,
    slot: Var,
    slots: ir.Expr,
    base: Var,
    length: ir.Expr,
    fits: ir.Expr | None,
) -> list[ir.Stmt]:
    """``fill``, which packs the words of B at ``coordinate`` into its slot of the panel
    (at ``base``), run only where the slot's tag does not name that coordinate yet, as
    ``ucf.passes.panels`` keeps the float panels: the declarations of the slot and its
    place, then the fill and the tag's store. Every block of a call that names the
    coordinate reads the same words, so each is packed once per call (at 90 % zero
    blocks a block column of bcsr(32,32) SpMM at 1024 serves about 3 blocks): in a
    parallel loop by the first thread of the team to name it (``fits`` true at the
    call: the team's cache holds every coordinate's words), else by each thread."""
    tags = panels.tag_buffer(rewriter, "quads_tags", slots, fits)
    return [
        ir.Decl(slot, panels.place(coordinate, slots)),
        ir.Decl(base, ir.mul(slot, length)),
        panels.tagged(rewriter, fill, coordinate, tags, slot, slots, fits),
    ]


def _factors(nest: Nest) -> tuple[ir.Load, ir.Load] | None:
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
    if used & local or unit_offset(varying.index, j) is None:
        return None
    return fixed, varying


def _panel(
    rewriter: TileState,
    load: ir.Load,
    kind: str,
    size: ir.Expr,
    fits: ir.Expr | None = None,
    zeroed: bool = True,
) -> ir.Array:
    """A new panel of int32 words for the pairs or quads of ``load``'s values: each
    thread's, or the team's where ``fits`` (``panels.buffer``)."""
    stem = f"{load.array.name.removesuffix('_vals')}_{kind}"
    return panels.buffer(rewriter, stem, "i32", size, fits, zeroed)


def _word(parts: list[ir.Expr]) -> ir.Expr:
    """The int32 (or vector of them) holding the first part in its low int16 half and the
    second in its high half: both fit in int16, so the sum carries nothing across."""
    low, high = parts
    return ir.add(ir.Bin("&", low, _const(0xFFFF, low)), ir.Bin("*", high, _const(1 << 16, low)))


def _bytes(parts: list[ir.Expr]) -> ir.Expr:
    """The int32 (or vector of them) whose four bytes, lowest first, are the low bytes
    of the four parts: the lower three as 0 to 255 times 1, 2**8 and 2**16, the top one
    as -128 to 127 times 2**24, so the sum carries nothing across and no product or sum
    leaves int32 (C's signed arithmetic must not overflow)."""
    low = [ir.Bin("&", x, _const(0xFF, x)) for x in parts]
    top = low[3]
    signed = ir.sub(top, ir.Bin("*", ir.Bin(">>", top, _const(7, top)), _const(256, top)))
    terms = [low[0], *(ir.Bin("*", x, _const(1 << 8 * i, x)) for i, x in enumerate(low[1:3], 1))]
    terms.append(ir.Bin("*", signed, _const(1 << 24, top)))
    word = terms[0]
    for x in terms[1:]:
        word = ir.add(word, x)
    return word


def _const(value: int, like: ir.Expr) -> ir.Expr:
    """An int32 constant, as a vector if ``like`` is one."""
    c = Const(value, "i32")
    n = ir.lanes(like.type)
    return c if n == 1 else ir.Splat(c, n)


def _i64(value: int) -> Const:
    return Const(value, I64)
