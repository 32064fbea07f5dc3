"""Gather-to-dense compute tiles over a dynamic operand's live micro-tiles (SparDA's
condensing), with a register-blocked micro-kernel, for the CPU targets.

A matmul ``C(b,i,n) = A(b,i,k) * B(b,k,n)`` whose A comes dense with a mask cut into
``bh x bw`` micro-tiles is, for each block of ``bh`` rows, a product over the block's
live columns k only (``ucf.stile.tile_index`` lists them, in any order: k is permutation
invariant).  Reading A and B in place along that list, as the generic lowering does,
sweeps the block's rows of C once per live k and runs at the speed of C's loads and
stores.  Here each block instead gathers up to ``depth`` live k's at a time (the
compute tile's depth, ``condense(k, A, depth)``): the block's A values at those k,
masked, into a dense workspace laid out for the micro-kernel (for each k, ``ROWS``
rows' values side by side), and, a slab of ``SLAB`` panels of ``width`` columns at a
time, the rows of B at those k into a dense packed one (per panel, the k's rows of it
one after another, so the micro-kernel streams it and a panel stays in the L1 cache
for every group of rows).
The micro-kernel then holds a tile of ``ROWS`` rows (``GATHERED_ROWS`` for MoE's
gathered rows) by ``width`` columns of C in vector registers across the whole gathered
depth: per k one load of B's panel row, one broadcast per row, and multiply-adds; C is
loaded and stored once per depth.

Every element of C adds its terms in the order the index lists the live k's, as the
generic kernel does, each a fused multiply-add as there (``ucf.passes.fma``), so the
two agree bit for bit (and llvm and c with them).  A block of a single
row (tiles of ``1 x bw``) skips the packing of B, which would cost as much as the
product, and reads B's rows in place with a one-row tile of ``SINGLE`` vectors.
"""

from __future__ import annotations

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Var
from ucf.stile.gather_step import (
    GATHERED_ROWS,
    ROWS,
    ROWS_BLOCK,
    ROWS_D,
    ROWS_SLAB,
    Names,
    c64,
    depth_tiles,
    gathered_step,
    matmul_spaces,
    row_blocks,
    rows_spaces,
)


def function(elem: str, idx: str, bh: int, bw: int, depth: int, threshold: int) -> ir.Function:
    """``ucf_condensed_spmm(A, K, pos, crd, B, C, NB, M, KD, N, BS)``: ``C += (A * K) @ B``
    over the live tiles of the stile index (``pos``, ``crd``) of the mask ``K`` (bytes),
    for ``NB`` row-major batches of A and K (``M x KD``) and C (``M x N``); B is ``KD x
    N`` at batch stride ``BS`` (0: one B for every batch). Threads start when the live
    tiles hold at least ``threshold`` multiply-adds."""
    v = Names(elem)
    groups = bh >= ROWS
    dt = depth_tiles(depth, bw)
    dk = dt * bw
    a, mask = ir.Array("A", elem), ir.Array("K", "u8")
    pos, crd = ir.Array("pos", idx), ir.Array("crd", idx)
    nb, m, kd, n, bs = (Var(x, I64) for x in ("NB", "M", "KD", "N", "BS"))
    t = Var("item", I64)
    bi, r0, nr = (Var(x, I64) for x in ("bi", "r0", "nr"))
    arow, crow, bbase = (Var(x, I64) for x in ("arow", "crow", "bbase"))
    p0, p1, chunk, q0, q1 = (Var(x, I64) for x in ("p0", "p1", "chunk", "q0", "q1"))
    q, k, k0 = (Var(x, I64) for x in ("q", "k", "k0"))
    kl, j, cnt = v.kl, v.j, v.cnt
    grid = ir.Bin("/", ir.add(m, c64(bh - 1)), c64(bh))

    def load_i(arr: ir.Array, at: ir.Expr) -> ir.Expr:
        return ir.cast(ir.Load(arr, at), I64)

    # The step's live k's, in the index's order.
    if bw == 1:
        listing: list[ir.Stmt] = [
            ir.Decl(cnt, ir.sub(q1, q0)),
            ir.For(q, q0, q1, [ir.Store(kl, ir.sub(q, q0), load_i(crd, q))]),
        ]
    else:
        inside = ir.For(
            k,
            k0,
            ir.minimum(ir.add(k0, c64(bw)), kd),
            [ir.Store(kl, cnt, k), ir.Assign(cnt, ir.add(cnt, c64(1)))],
        )
        listing = [
            ir.Decl(cnt, c64(0)),
            ir.For(q, q0, q1, [ir.Decl(k0, ir.mul(load_i(crd, q), c64(bw))), inside]),
        ]

    def masked(r: ir.Expr, tag: str) -> tuple[list[ir.Stmt], ir.Expr]:
        start = Var(f"a_{tag}", I64)
        at = ir.add(start, ir.Load(kl, j))
        value = ir.Bin("*", ir.Load(a, at), ir.Cast(ir.Load(mask, at), elem))
        return [ir.Decl(start, ir.add(arow, ir.mul(r, kd)))], value

    b_row = ir.add(bbase, ir.mul(ir.Load(kl, j), n))
    step = [
        ir.Decl(q0, ir.add(p0, ir.mul(chunk, c64(dt)))),
        ir.Decl(q1, ir.minimum(ir.add(q0, c64(dt)), p1)),
        *listing,
        *gathered_step(v, groups, nr, masked, b_row, lambda r: ir.add(crow, ir.mul(r, n))),
    ]
    block = [
        ir.Decl(bi, ir.Bin("/", t, grid)),
        ir.Decl(r0, ir.mul(ir.sub(t, ir.mul(bi, grid)), c64(bh))),
        ir.Decl(nr, ir.minimum(c64(bh), ir.sub(m, r0))),
        ir.Decl(arow, ir.mul(ir.add(ir.mul(bi, m), r0), kd)),
        ir.Decl(crow, ir.mul(ir.add(ir.mul(bi, m), r0), n)),
        ir.Decl(bbase, ir.mul(bi, bs)),
        ir.Decl(p0, load_i(pos, t)),
        ir.Decl(p1, load_i(pos, ir.add(t, c64(1)))),
        ir.For(chunk, c64(0), ir.Bin("/", ir.add(ir.sub(p1, p0), c64(dt - 1)), c64(dt)), step),
    ]
    # Multiply-adds: the live tiles' elements by B's columns (the pos entry past the
    # last row of tiles counts every live tile).
    work = ir.mul(ir.mul(load_i(pos, ir.mul(nb, grid)), c64(bh * bw)), n)
    params = [
        ir.Param("A", elem, True, doc="the dynamic operand, row-major"),
        ir.Param("K", "u8", True, doc="its mask, bytes 0/1"),
        ir.Param("pos", idx, True, doc="the stile index: segments per row of tiles"),
        ir.Param("crd", idx, True, doc="the stile index: live tile columns"),
        ir.Param("B", elem, True, doc="the dense operand, row-major"),
        ir.Param("C", elem, True, output=True, doc="the output, added into"),
        *(ir.Param(x.name, I64, False) for x in (nb, m, kd, n, bs)),
    ]
    body = row_blocks(
        v, ir.mul(nb, grid), block, matmul_spaces(v, bh, bw, depth), groups, work, threshold
    )
    doc = f"C += (A * K) @ B over the live {bh}x{bw} tiles, {dk} k's per step"
    return ir.Function(f"ucf_condensed_spmm_{bh}x{bw}", params, body, doc=doc)


def rows_function(elem: str, idx: str, bt: int, depth: int, threshold: int) -> ir.Function:
    """``ucf_condensed_rows(R, K, pos, crd, X, B, C, NB, T, D, N, SET)``: for each of
    ``NB`` batches e, ``C[e, t, :] += (R[e, t] * K[e, t]) * X[t, :] @ B[e]`` over the
    live tokens t of the stile index (``pos``, ``crd``; tiles of ``bt`` tokens) of the
    mask ``K`` of R (``NB x T``); X is ``T x D``, B ``NB x D x N``, C ``NB x T x N``.
    With ``SET`` nonzero those rows of C are set (``=``), not added into: the kernel
    never loads them, which on a scattered row is a cache miss per register tile. An
    ``=`` statement's C is zero elsewhere: already (``SET`` 1, a new C), or zeroed by
    the kernel (``SET`` 2: the rows of tiles the mask has no live token in, in
    parallel before the product).

    The condensed variable is the output's t (MoE's tokens of an expert): an item
    gathers up to ``depth`` of an expert's live tokens (whole tiles), each X row scaled
    by its gate, and multiplies them by the expert's B, ``ROWS_D`` of D at a time, into
    those rows of C. Threads start when the live tokens hold at least ``threshold``
    multiply-adds."""
    v = Names(elem)
    groups, dk, slab = True, ROWS_D, ROWS_SLAB
    per = depth_tiles(depth, bt)
    rows = per * bt
    r, mask, x = ir.Array("R", elem), ir.Array("K", "u8"), ir.Array("X", elem)
    pos, crd = ir.Array("pos", idx), ir.Array("crd", idx)
    tl, gl = v.tl, v.gl
    nb, tt, d, n, overwrite = (Var(y, I64) for y in ("NB", "T", "D", "N", "SET"))
    item, e, q0, q1, nr = (Var(y, I64) for y in ("item", "e", "q0", "q1", "nr"))
    p0, p1, parts, size = (Var(y, I64) for y in ("p0", "p1", "parts", "size"))
    q, t, t0, step, d0 = (Var(y, I64) for y in ("q", "t", "t0", "step", "d0"))
    j, cnt = v.j, v.cnt
    items_per = ir.Bin(
        "/", ir.add(ir.Bin("/", ir.add(tt, c64(bt - 1)), c64(bt)), c64(per - 1)), c64(per)
    )

    def load_i(arr: ir.Array, at: ir.Expr) -> ir.Expr:
        return ir.cast(ir.Load(arr, at), I64)

    gate = ir.add(ir.mul(e, tt), t)
    tokens = [
        ir.Decl(nr, c64(0)),
        ir.For(
            q,
            q0,
            q1,
            [
                ir.Decl(t0, ir.mul(load_i(crd, q), c64(bt))),
                ir.For(
                    t,
                    t0,
                    ir.minimum(ir.add(t0, c64(bt)), tt),
                    [
                        ir.Store(tl, nr, t),
                        ir.Store(
                            gl,
                            nr,
                            ir.Bin("*", ir.Load(r, gate), ir.Cast(ir.Load(mask, gate), elem)),
                        ),
                        ir.Assign(nr, ir.add(nr, c64(1))),
                    ],
                ),
            ],
        ),
    ]
    col = ir.add(d0, j)

    def scaled(row: ir.Expr, tag: str) -> tuple[list[ir.Stmt], ir.Expr]:
        start, gate = Var(f"x_{tag}", I64), Var(f"gate_{tag}", elem)
        decls = [
            ir.Decl(start, ir.add(ir.mul(ir.Load(tl, row), d), d0)),
            ir.Decl(gate, ir.Load(gl, row)),
        ]
        return decls, ir.Bin("*", gate, ir.Load(x, ir.add(start, j)))

    b_row = ir.mul(ir.add(ir.mul(e, d), col), n)
    c_row = lambda row: ir.mul(ir.add(ir.mul(e, tt), ir.Load(tl, row)), n)  # noqa: E731
    # Every step but the first adds into what the first wrote.
    reads_c = ir.Logic("or", ir.Cmp("==", overwrite, c64(0)), ir.Cmp(">", step, c64(0)))
    steps = ir.For(
        step,
        c64(0),
        ir.Bin("/", ir.add(d, c64(dk - 1)), c64(dk)),
        [
            ir.Decl(d0, ir.mul(step, c64(dk))),
            ir.Decl(cnt, ir.minimum(c64(dk), ir.sub(d, d0))),
            *gathered_step(
                v, groups, nr, scaled, b_row, c_row, slab, reads_c, GATHERED_ROWS, ROWS_BLOCK
            ),
        ],
    )
    body = [
        # Items go part-major (every batch's first part, then every second part, ...), so
        # the last items the threads take are later parts of batches that have several
        # rather than whole batches: for bench/stile.py's MoE at a depth of 512 a model
        # of two threads taking items in turn put the makespan 3-4 % nearer the ideal.
        ir.Decl(e, ir.Bin("%", item, nb)),
        ir.Decl(p0, load_i(pos, e)),
        ir.Decl(p1, load_i(pos, ir.add(e, c64(1)))),
        # The batch's live tiles in equal parts of at most ``per``: no part is a sliver
        # left over.
        ir.Decl(
            parts,
            ir.Bin("max", ir.Bin("/", ir.add(ir.sub(p1, p0), c64(per - 1)), c64(per)), c64(1)),
        ),
        ir.Decl(size, ir.Bin("/", ir.add(ir.sub(p1, p0), ir.sub(parts, c64(1))), parts)),
        ir.Decl(q0, ir.add(p0, ir.mul(ir.Bin("/", item, nb), size))),
        ir.Decl(q1, ir.minimum(ir.add(q0, size), p1)),
        ir.If(ir.Cmp("<", q0, q1), [*tokens, steps]),
    ]
    spaces = rows_spaces(v, bt, depth)
    params = [
        ir.Param("R", elem, True, doc="the dynamic operand (gates), row-major"),
        ir.Param("K", "u8", True, doc="its mask, bytes 0/1"),
        ir.Param("pos", idx, True, doc="the stile index: segments per batch"),
        ir.Param("crd", idx, True, doc="the stile index: live tiles of tokens"),
        ir.Param("X", elem, True, doc="the rows gathered, row-major"),
        ir.Param("B", elem, True, doc="one dense matrix per batch, row-major"),
        ir.Param("C", elem, True, output=True, doc="the output, added into or set"),
        *(ir.Param(y.name, I64, False) for y in (nb, tt, d, n, overwrite)),
    ]
    # Multiply-adds: the live tokens (all of pos's tiles, whole) by D x N.
    work = ir.mul(ir.mul(ir.mul(load_i(pos, nb), c64(bt)), d), n)
    loop = row_blocks(v, ir.mul(nb, items_per), body, spaces, groups, work, threshold)
    zeros = _zero_dead_rows(mask, v.c, bt, nb, tt, n, threshold)
    doc = f"C[e] += (R * K)[e] X @ B[e] over the live tiles of {bt} tokens, {rows} per item"
    return ir.Function(
        f"ucf_condensed_rows_{bt}",
        params,
        [ir.If(ir.Cmp("==", overwrite, c64(2)), zeros), *loop],
        doc=doc,
    )


#: Rows of C a thread of ``_zero_dead_rows`` takes at a time (whole tiles).
ZERO_ROWS = 256


def _zero_dead_rows(
    mask: ir.Array, c: ir.Array, bt: int, nb: Var, tt: Var, n: Var, threshold: int
) -> list[ir.Stmt]:
    """Zeros, in parallel, the rows of C (``NB x T x N``) whose tile of ``bt`` rows has
    no live token in the mask ``K`` (``NB x T``), the rows ``rows_function`` does not
    set. A run of such rows is one span of C, zeroed by a loop the compilers turn into
    a ``memset``."""
    per = max(1, ZERO_ROWS // bt)
    tiles = Var("ztiles", I64)
    blocks, zi, e, q, t, live, start, col = (
        Var(y, I64) for y in ("zblocks", "zi", "ze", "zq", "zt", "zlive", "zstart", "zcol")
    )
    first, last, end = (Var(y, I64) for y in ("zfirst", "zlast", "zend"))
    row = ir.add(ir.mul(e, tt), t)
    clear = [
        ir.For(col, ir.mul(start, n), ir.mul(row, n), [ir.Store(c, col, ir.Const(0.0, c.elem))])
    ]
    # Walk the block's rows, a tile at a time; ``start`` is where the current run of dead
    # rows began (-1: none).
    tile = [
        ir.Decl(end, ir.minimum(ir.add(t, c64(bt)), tt)),
        ir.Decl(live, c64(0)),
        ir.For(
            q,
            t,
            end,
            [
                ir.Assign(
                    live, ir.Bin("max", live, ir.cast(ir.Load(mask, ir.add(ir.mul(e, tt), q)), I64))
                )
            ],
        ),
        ir.If(
            ir.Logic("and", ir.Cmp("!=", live, c64(0)), ir.Cmp(">=", start, c64(0))),
            [*clear, ir.Assign(start, c64(-1))],
        ),
        ir.If(
            ir.Logic("and", ir.Cmp("==", live, c64(0)), ir.Cmp("<", start, c64(0))),
            [ir.Assign(start, row)],
        ),
        ir.Assign(t, end),
    ]
    body = [
        ir.Decl(e, ir.Bin("/", zi, blocks)),
        ir.Decl(first, ir.mul(ir.sub(zi, ir.mul(e, blocks)), c64(per * bt))),
        ir.Decl(last, ir.minimum(ir.add(first, c64(per * bt)), tt)),
        ir.Decl(start, c64(-1)),
        ir.Decl(t, first),
        ir.While(ir.Cmp("<", t, last), tile),
        ir.If(ir.Cmp(">=", start, c64(0)), clear),
    ]
    return [
        ir.Decl(tiles, ir.Bin("/", ir.add(tt, c64(bt - 1)), c64(bt))),
        ir.Decl(blocks, ir.Bin("/", ir.add(tiles, c64(per - 1)), c64(per))),
        ir.For(
            zi,
            c64(0),
            ir.mul(nb, blocks),
            body,
            parallel="CPUThread",
            strategy="NoRaces",
            schedule=("dynamic", 1),
            parallel_if=ir.Cmp(">=", ir.mul(ir.mul(nb, tt), n), c64(threshold)),
        ),
    ]
