"""Gather-to-dense compute tiles over a dynamic operand's live micro-tiles (SparDA's
condensing), with a register-blocked micro-kernel, for the CPU targets.

A matmul ``C(b,i,n) = A(b,i,k) * B(b,k,n)`` whose A comes dense with a mask cut into
``bh x bw`` micro-tiles is, for each block of ``bh`` rows, a product over the block's
live columns k only (``ucf.stile`` lists them, in any order: k is permutation
invariant).  Reading A and B in place along that list, as the generic lowering does,
sweeps the block's rows of C once per live k and runs at the speed of C's loads and
stores.  Here each block instead gathers up to ``depth`` live k's at a time (the
compute tile's depth, ``condense(k, A, depth)``): the block's A values at those k,
masked, into a dense workspace laid out for the micro-kernel (for each k, ``ROWS``
rows' values side by side), and, a slab of ``SLAB`` panels of ``width`` columns at a
time, the rows of B at those k into a dense packed one (per panel, the k's rows of it
one after another, so the micro-kernel streams it and a panel stays in the L1 cache
for every group of rows).
The micro-kernel then holds a tile of ``ROWS`` rows by ``width`` columns of C in
vector registers across the whole gathered depth: per k one load of B's panel row,
one broadcast per row, and multiply-adds; C is loaded and stored once per depth.

Every element of C adds its terms in the order the index lists the live k's, as the
generic kernel does, so the two agree bit for bit (and llvm and c with them: the C
target compiles without contraction into fused multiply-adds).  A block of a single
row (tiles of ``1 x bw``) skips the packing of B, which would cost as much as the
product, and reads B's rows in place with a one-row tile of ``SINGLE`` vectors.
"""

from __future__ import annotations

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var

#: The width of a vector register the tiles are cut for (AVX2's).
VECTOR_BYTES = 32
#: Rows of a register tile, and vectors per row: ROWS x VECTORS accumulators, VECTORS
#: of B's panel and a broadcast fit in x86-64's 16 vector registers.
ROWS = 4
VECTORS = 2
#: Vectors of a one-row tile (blocks of a single row, or the rows a block has beyond
#: its last whole group of ROWS when B is not packed).
SINGLE = 4
#: The compute tile's depth when the schedule does not set one: live k's gathered per
#: step. Measured on bench/stile.py (4096^2 A, 32x1 tiles, 1024 columns of B).
DEPTH = 128
#: Panels of B packed together: a step reads SLAB x VECTORS vectors of each of its rows
#: of B in order (1 KB of float32), which the hardware prefetchers follow. Packing one
#: panel at a time (64 bytes of each row) took 1.8x as long on bench/stile.py at 50 %,
#: 64 panels at a time 1.2x (the packed step then crowds the L2 cache).
SLAB = 16
_SIZES = {"f32": 4, "f64": 8}


def depth_tiles(depth: int, bw: int) -> int:
    """Micro-tiles gathered per step for a depth of ``depth`` k's (whole tiles, one at
    least)."""
    return max(1, -(-depth // bw))


def function(elem: str, idx: str, bh: int, bw: int, depth: int, threshold: int) -> ir.Function:
    """``ucf_condensed_spmm(A, K, pos, crd, B, C, NB, M, KD, N, BS)``: ``C += (A * K) @ B``
    over the live tiles of the stile index (``pos``, ``crd``) of the mask ``K`` (bytes),
    for ``NB`` row-major batches of A and K (``M x KD``) and C (``M x N``); B is ``KD x
    N`` at batch stride ``BS`` (0: one B for every batch). Threads start when A has at
    least ``threshold`` elements."""
    lanes = VECTOR_BYTES // _SIZES[elem]
    groups = bh >= ROWS
    width = (VECTORS if groups else SINGLE) * lanes
    dt = depth_tiles(depth, bw)
    dk = dt * bw
    a, mask = ir.Array("A", elem), ir.Array("K", "u8")
    pos, crd = ir.Array("pos", idx), ir.Array("crd", idx)
    b, c = ir.Array("B", elem), ir.Array("C", elem, output=True)
    kl, ag, bg = ir.Array("kl", I64), ir.Array("ag", elem), ir.Array("bg", elem)
    nb, m, kd, n, bs = (Var(x, I64) for x in ("NB", "M", "KD", "N", "BS"))
    t, bi, r0, nr = (Var(x, I64) for x in ("t", "bi", "r0", "nr"))
    arow, crow, bbase = (Var(x, I64) for x in ("arow", "crow", "bbase"))
    p0, p1, chunk, q0, q1 = (Var(x, I64) for x in ("p0", "p1", "chunk", "q0", "q1"))
    cnt, full, panels = Var("cnt", I64), Var("full", I64), Var("panels", I64)
    q, k, k0, j, row, g, pn = (Var(x, I64) for x in ("q", "k", "k0", "j", "row", "g", "pn"))
    slab, lo, hi = (Var(x, I64) for x in ("slab", "lo", "hi"))
    zero, one = Const(0, I64), Const(1, I64)
    grid = ir.Bin("/", ir.add(m, Const(bh - 1, I64)), Const(bh, I64))

    def c_(v: int) -> Const:
        return Const(v, I64)

    def load_i(arr: ir.Array, at: ir.Expr) -> ir.Expr:
        return ir.cast(ir.Load(arr, at), I64)

    # The step's live k's, in the index's order.
    if bw == 1:
        listing: list[ir.Stmt] = [
            ir.Decl(cnt, ir.sub(q1, q0)),
            ir.For(q, q0, q1, [ir.Store(kl, ir.sub(q, q0), load_i(crd, q))]),
        ]
    else:
        listing = [
            ir.Decl(cnt, zero),
            ir.For(
                q,
                q0,
                q1,
                [
                    ir.Decl(k0, ir.mul(load_i(crd, q), c_(bw))),
                    ir.For(
                        k,
                        k0,
                        ir.minimum(ir.add(k0, c_(bw)), kd),
                        [ir.Store(kl, cnt, k), ir.Assign(cnt, ir.add(cnt, one))],
                    ),
                ],
            ),
        ]

    def masked(r: ir.Expr) -> ir.Expr:
        at = ir.add(ir.add(arow, ir.mul(r, kd)), ir.Load(kl, j))
        return ir.Bin("*", ir.Load(a, at), ir.Cast(ir.Load(mask, at), elem))

    # A's values at those k's: a group of ROWS rows stores each k's ROWS values side by
    # side (the micro-kernel broadcasts them in turn); a row past the last group, its own.
    grouped = ir.add(ir.mul(ir.add(ir.mul(g, cnt), j), c_(ROWS)), ir.Bin("%", row, c_(ROWS)))
    gather = [
        ir.Decl(full, ir.Bin("/", nr, c_(ROWS)) if groups else zero),
        ir.For(
            row,
            zero,
            ir.mul(full, c_(ROWS)),
            [
                ir.Decl(g, ir.Bin("/", row, c_(ROWS))),
                ir.For(j, zero, cnt, [ir.Store(ag, grouped, masked(row))]),
            ],
        ),
        ir.For(
            row,
            ir.mul(full, c_(ROWS)),
            nr,
            [ir.For(j, zero, cnt, [ir.Store(ag, ir.add(ir.mul(row, cnt), j), masked(row))])],
        ),
    ]
    b_row = ir.add(bbase, ir.mul(ir.Load(kl, j), n))
    pack: list[ir.Stmt] = []
    if groups:
        # A slab of SLAB panels of the step's rows of B, k after k (each row's part
        # read in order, which the prefetchers follow), stored panel by panel.
        at = ir.mul(ir.add(ir.mul(ir.sub(pn, lo), cnt), j), c_(width))
        src = ir.add(b_row, ir.mul(pn, c_(width)))
        pack = [
            ir.For(
                j,
                zero,
                cnt,
                [
                    ir.For(
                        pn,
                        lo,
                        hi,
                        [
                            ir.Store(
                                bg,
                                ir.add(at, c_(v * lanes)),
                                ir.VLoad(b, ir.add(src, c_(v * lanes)), lanes),
                            )
                            for v in range(width // lanes)
                        ],
                    )
                ],
            )
        ]

    def micro(rows: int, first: ir.Expr, a_at, prefix: str) -> list[ir.Stmt]:
        """One register tile: ``rows`` rows of C from ``first`` on by the panel ``pn``,
        summed over the step's k's (``a_at(r)``: where row r's value of k j is)."""
        vecs = width // lanes
        acc = {
            (r, v): Var(f"{prefix}acc{r}_{v}", ir.vector(elem, lanes))
            for r in range(rows)
            for v in range(vecs)
        }
        places = {
            (r, v): ir.add(
                ir.add(ir.add(crow, ir.mul(ir.add(first, c_(r)), n)), ir.mul(pn, c_(width))),
                c_(v * lanes),
            )
            for r in range(rows)
            for v in range(vecs)
        }
        head = [ir.Decl(x, ir.VLoad(c, places[key], lanes)) for key, x in acc.items()]
        tail = [ir.Store(c, places[key], x) for key, x in acc.items()]
        bv = [Var(f"{prefix}b{v}", ir.vector(elem, lanes)) for v in range(vecs)]
        if groups:
            b_at = [
                ir.add(ir.mul(ir.add(ir.mul(ir.sub(pn, lo), cnt), j), c_(width)), c_(v * lanes))
                for v in range(vecs)
            ]
            loads = [ir.Decl(x, ir.VLoad(bg, at, lanes)) for x, at in zip(bv, b_at, strict=True)]
        else:
            loads = [
                ir.Decl(
                    x,
                    ir.VLoad(b, ir.add(ir.add(b_row, ir.mul(pn, c_(width))), c_(v * lanes)), lanes),
                )
                for v, x in enumerate(bv)
            ]
        # Every broadcast before the multiply-adds: interleaved, GCC 12 kept one
        # accumulator on the stack (a store and a load per k; c ran 1.7x slower).
        splats = [Var(f"{prefix}a{r}", ir.vector(elem, lanes)) for r in range(rows)]
        body: list[ir.Stmt] = [
            *loads,
            *(ir.Decl(s, ir.Splat(ir.Load(ag, a_at(r)), lanes)) for r, s in enumerate(splats)),
        ]
        for r, s in enumerate(splats):
            for v in range(vecs):
                x = acc[r, v]
                body.append(ir.Assign(x, ir.Bin("+", x, ir.Bin("*", s, bv[v]))))
        return [*head, ir.For(j, zero, cnt, body), *tail]

    tiles: list[ir.Stmt] = []
    if groups:
        group = micro(
            ROWS,
            ir.mul(g, c_(ROWS)),
            lambda r: ir.add(ir.mul(ir.add(ir.mul(g, cnt), j), c_(ROWS)), c_(r)),
            "g",
        )
        tiles.append(ir.For(g, zero, full, group))
    single = micro(1, row, lambda r: ir.add(ir.mul(row, cnt), j), "s")
    tiles.append(ir.For(row, ir.mul(full, c_(ROWS)), nr, single))
    # The columns past the last whole panel, one at a time from B in place.
    col, sum_ = Var("col", I64), Var("sum", elem)
    a_any = ir.Select(
        ir.Cmp("<", row, ir.mul(full, c_(ROWS))),
        ir.Load(ag, grouped),
        ir.Load(ag, ir.add(ir.mul(row, cnt), j)),
    )
    at_c = ir.add(ir.add(crow, ir.mul(row, n)), col)
    rest = ir.For(
        row,
        zero,
        nr,
        [
            ir.Decl(g, ir.Bin("/", row, c_(ROWS))),
            ir.For(
                col,
                ir.mul(panels, c_(width)),
                n,
                [
                    ir.Decl(sum_, ir.Load(c, at_c)),
                    ir.For(
                        j,
                        zero,
                        cnt,
                        [
                            ir.Assign(
                                sum_,
                                ir.Bin(
                                    "+", sum_, ir.Bin("*", a_any, ir.Load(b, ir.add(b_row, col)))
                                ),
                            )
                        ],
                    ),
                    ir.Store(c, at_c, sum_),
                ],
            ),
        ],
    )
    step = [
        ir.Decl(q0, ir.add(p0, ir.mul(chunk, c_(dt)))),
        ir.Decl(q1, ir.minimum(ir.add(q0, c_(dt)), p1)),
        *listing,
        *gather,
        ir.For(
            slab,
            zero,
            ir.Bin("/", ir.add(panels, c_(SLAB - 1)), c_(SLAB)),
            [
                ir.Decl(lo, ir.mul(slab, c_(SLAB))),
                ir.Decl(hi, ir.minimum(ir.add(lo, c_(SLAB)), panels)),
                *pack,
                ir.For(pn, lo, hi, tiles),
            ],
        ),
        rest,
    ]
    block = [
        ir.Decl(bi, ir.Bin("/", t, grid)),
        ir.Decl(r0, ir.mul(ir.sub(t, ir.mul(bi, grid)), c_(bh))),
        ir.Decl(nr, ir.minimum(c_(bh), ir.sub(m, r0))),
        ir.Decl(arow, ir.mul(ir.add(ir.mul(bi, m), r0), kd)),
        ir.Decl(crow, ir.mul(ir.add(ir.mul(bi, m), r0), n)),
        ir.Decl(bbase, ir.mul(bi, bs)),
        ir.Decl(p0, load_i(pos, t)),
        ir.Decl(p1, load_i(pos, ir.add(t, one))),
        ir.For(chunk, zero, ir.Bin("/", ir.add(ir.sub(p1, p0), c_(dt - 1)), c_(dt)), step),
    ]
    workspaces = [kl, ag, *([bg] if groups else [])]
    sizes = [c_(dk), c_(bh * dk), c_(SLAB * dk * width)]
    size: ir.Expr = ir.mul(ir.mul(nb, m), kd)
    loop = ir.For(
        t,
        zero,
        ir.mul(nb, grid),
        block,
        parallel="CPUThread",
        strategy="NoRaces",
        schedule=("dynamic", 1),
        prologue=[ir.Alloc(w, s) for w, s in zip(workspaces, sizes, strict=False)],
        epilogue=[ir.Free(w) for w in workspaces],
        parallel_if=ir.Cmp(">=", size, c_(threshold)),
    )
    params = [
        ir.Param("A", elem, True, doc="the dynamic operand, row-major"),
        ir.Param("K", "u8", True, doc="its mask, bytes 0/1"),
        ir.Param("pos", idx, True, doc="the stile index: segments per row of tiles"),
        ir.Param("crd", idx, True, doc="the stile index: live tile columns"),
        ir.Param("B", elem, True, doc="the dense operand, row-major"),
        ir.Param("C", elem, True, output=True, doc="the output, added into"),
        *(ir.Param(v.name, I64, False) for v in (nb, m, kd, n, bs)),
    ]
    body: list[ir.Stmt] = [ir.Decl(panels, ir.Bin("/", n, c_(width))), loop]
    doc = f"C += (A * K) @ B over the live {bh}x{bw} tiles, {dk} k's per step"
    return ir.Function(f"ucf_condensed_spmm_{bh}x{bw}", params, body, doc=doc)
