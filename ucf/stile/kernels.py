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

from collections.abc import Callable

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var

#: The width of a vector register the tiles are cut for (AVX2's).
VECTOR_BYTES = 32
#: Rows of a register tile, and vectors per row: ROWS x VECTORS accumulators, VECTORS
#: of B's panel and a broadcast fit in x86-64's 16 vector registers.
ROWS = 4
VECTORS = 2
#: Rows of ``rows_function``'s register tile: 12 accumulators, 2 vectors of B and one
#: broadcast fill the 16 registers, for 12 multiply-adds per 8 loads (a 4-row tile's 8
#: per 6). On bench/stile.py's MoE (the kernel alone, one thread, in turns in one
#: process) it took 0.95x the CPU time of 4 rows on llvm and 0.6x on c. The
#: matmul's blocks of rows (tiles of 32 x 1) keep ``ROWS``, which divides them.
GATHERED_ROWS = 6
#: Vectors of a one-row tile (blocks of fewer than ROWS rows, which read B in place).
SINGLE = 4
#: The compute tile's depth when the schedule does not set one: live k's (or live rows,
#: for ``rows_function``) gathered per step. On bench/stile.py (4096^2 A, 32x1 tiles,
#: 1024 columns of B) 32 took ~1.3x as long, 64 to 256 were within the noise of a
#: shared machine; at 128 a packed slab (128 KB of float32) and a 32-row block of C
#: (128 KB) share a 512 KB L2 cache.
DEPTH = 128
#: The same for ``rows_function``: tokens of one batch an item gathers. Each item packs
#: its batch's rows of B afresh, so fewer, larger items pack less: on bench/stile.py's
#: MoE (experts of ~512 tokens, d = n = 512; the kernel alone, one thread, a shared
#: machine) 512 took 0.90-0.98x the CPU time of 128 and 0.93-0.99x that of 256. A
#: batch's tokens are cut into equal items, so no item is a sliver left over.
ROWS_DEPTH = 512
#: Panels of B packed together: a step reads SLAB x VECTORS vectors of each of its rows
#: of B in order (1 KB of float32), which the hardware prefetchers follow. Packing one
#: panel at a time (64 bytes of each row) took 1.8x as long on bench/stile.py at 50 %,
#: 64 panels at a time 1.2x (the packed step then crowds the L2 cache).
SLAB = 16
SIZES = {"f32": 4, "f64": 8, I64: 8}


#: The d's a step of gathered rows (``rows_function``) multiplies over, and the panels
#: of B it packs together. The rows' part of C is loaded and stored once per step,
#: from scattered rows the prefetchers do not follow, so a step runs over a whole d of
#: 512 (MoE's); that many rows of B packed 4 panels at a time fill 128 KB. On
#: bench/stile.py's MoE (d = 512) this took 0.75-0.85x the time of 128 d's by 16 panels.
ROWS_D = 512
ROWS_SLAB = 4
#: Groups of gathered rows taken through a slab's panels together: 4 groups of 6 rows
#: (48 KB of gathered values) stay in L2 beside the slab (128 KB). On bench/stile.py's
#: MoE (the kernel alone, one thread, in turns in one process) this and a remainder of
#: rows in one tile (not row by row) took 0.95x the CPU time of neither, on llvm and c.
ROWS_BLOCK = 4


def depth_tiles(depth: int, bw: int) -> int:
    """Micro-tiles gathered per step for a depth of ``depth`` k's (whole tiles, one at
    least)."""
    return max(1, -(-depth // bw))


class _Names:
    """The variables and workspaces every condensed kernel's step uses."""

    def __init__(self, elem: str):
        self.elem = elem
        self.lanes = VECTOR_BYTES // SIZES[elem]
        self.kl, self.ag, self.bg = ir.Array("kl", I64), ir.Array("ag", elem), ir.Array("bg", elem)
        self.tl, self.gl = ir.Array("tl", I64), ir.Array("gl", elem)
        self.b, self.c = ir.Array("B", elem), ir.Array("C", elem, output=True)
        names = ("cnt", "full", "panels", "j", "row", "g", "pn", "slab", "lo", "hi", "col")
        self.n = Var("N", I64)
        for x in names:
            setattr(self, x, Var(x, I64))


def _c(v: int) -> Const:
    return Const(v, I64)


def _step(
    v: _Names,
    groups: bool,
    nr: ir.Expr,
    a_row: Callable[[ir.Expr, str], tuple[list[ir.Stmt], ir.Expr]],
    b_row: ir.Expr,
    c_row: Callable[[ir.Expr], ir.Expr],
    slab: int = SLAB,
    reads_c: ir.Expr | None = None,
    tile: int = ROWS,
    block: int = 0,
) -> list[ir.Stmt]:
    """One step over ``v.cnt`` gathered k's (the j-th at ``v.kl[j]`` where the callers
    need it) for ``nr`` rows, in register tiles of ``tile`` rows: A's values gathered
    (``a_row(row, tag)``: declarations of the row's own, their names tagged, and its
    value at k j), B's rows packed (``b_row``: where the row of k j starts), the register
    tiles added into the rows of C (``c_row(row)``: where row ``row`` starts; with
    ``block``, that many groups of rows at a time through each slab), then the columns
    past the last whole panel. Where ``reads_c`` is given and false, the rows of
    C are written, not added into: the step skips loading them."""
    elem, lanes = v.elem, v.lanes
    ag, bg, b, c = v.ag, v.bg, v.b, v.c
    cnt, full, panels, j, row, g, pn = v.cnt, v.full, v.panels, v.j, v.row, v.g, v.pn
    lo, hi = v.lo, v.hi
    zero = _c(0)
    width = (VECTORS if groups else SINGLE) * lanes

    def old_c(load: ir.Expr) -> ir.Expr:
        """What a tile of C starts from: ``load``, or zeros where ``reads_c`` is false."""
        if reads_c is None:
            return load
        nothing = ir.Const(0.0, elem)
        return ir.Select(reads_c, load, ir.Splat(nothing, lanes) if load.type != elem else nothing)

    # A's values at the step's k's: a group of ``tile`` rows stores each k's ``tile`` values
    # side by side (the micro-kernel broadcasts them in turn), k after k, so the stores run in
    # order and each row's own values are worked out once; a row past the last group
    # stores its own.
    grouped = ir.add(ir.mul(ir.add(ir.mul(g, cnt), j), _c(tile)), ir.Bin("%", row, _c(tile)))
    alone = ir.add(ir.mul(row, cnt), j)
    rows = [a_row(ir.add(ir.mul(g, _c(tile)), _c(r)), f"r{r}") for r in range(tile)]
    group_at = ir.mul(ir.add(ir.mul(g, cnt), j), _c(tile))
    own, value = a_row(row, "s")
    gather = [
        ir.Decl(full, ir.Bin("/", nr, _c(tile)) if groups else zero),
        ir.For(
            g,
            zero,
            full,
            [
                *(d for decls, _ in rows for d in decls),
                ir.For(
                    j,
                    zero,
                    cnt,
                    [ir.Store(ag, ir.add(group_at, _c(r)), x) for r, (_, x) in enumerate(rows)],
                ),
            ],
        ),
        ir.For(
            row,
            ir.mul(full, _c(tile)),
            nr,
            [*own, ir.For(j, zero, cnt, [ir.Store(ag, alone, value)])],
        ),
    ]
    pack: list[ir.Stmt] = []
    packed_at = ir.mul(ir.add(ir.mul(ir.sub(pn, lo), cnt), j), _c(width))
    if groups:
        # A slab of SLAB panels of the step's rows of B, k after k (each row's part
        # read in order, which the prefetchers follow), stored panel by panel.
        src = ir.add(b_row, ir.mul(pn, _c(width)))
        copy = [
            ir.Store(
                bg, ir.add(packed_at, _c(x * lanes)), ir.VLoad(b, ir.add(src, _c(x * lanes)), lanes)
            )
            for x in range(width // lanes)
        ]
        pack = [ir.For(j, zero, cnt, [ir.For(pn, lo, hi, copy)])]

    def micro(
        rows: int, first: ir.Expr, a_at: Callable[[int], ir.Expr], prefix: str
    ) -> list[ir.Stmt]:
        """One register tile: ``rows`` rows of C from ``first`` on by the panel ``pn``,
        summed over the step's k's (``a_at(r)``: where row r's value of k j is)."""
        vecs = width // lanes
        acc = {
            (r, x): Var(f"{prefix}acc{r}_{x}", ir.vector(elem, lanes))
            for r in range(rows)
            for x in range(vecs)
        }
        places = {
            (r, x): ir.add(
                ir.add(c_row(ir.add(first, _c(r))), ir.mul(pn, _c(width))), _c(x * lanes)
            )
            for r, x in acc
        }
        head = [ir.Decl(a, old_c(ir.VLoad(c, places[key], lanes))) for key, a in acc.items()]
        tail = [ir.Store(c, places[key], a) for key, a in acc.items()]
        bv = [Var(f"{prefix}b{x}", ir.vector(elem, lanes)) for x in range(vecs)]
        if groups:
            at = [ir.add(packed_at, _c(x * lanes)) for x in range(vecs)]
            loads = [ir.Decl(y, ir.VLoad(bg, p, lanes)) for y, p in zip(bv, at, strict=True)]
        else:
            src = ir.add(b_row, ir.mul(pn, _c(width)))
            loads = [
                ir.Decl(y, ir.VLoad(b, ir.add(src, _c(x * lanes)), lanes)) for x, y in enumerate(bv)
            ]
        # Each row's broadcast just before its multiply-adds: one broadcast live at a
        # time, so a tile of 6 rows (12 accumulators, 2 vectors of B and the broadcast)
        # fits x86-64's 16 vector registers; with every broadcast first it needs 20,
        # and GCC 12 kept accumulators on the stack.
        body: list[ir.Stmt] = list(loads)
        for r in range(rows):
            s = Var(f"{prefix}a{r}", ir.vector(elem, lanes))
            body.append(ir.Decl(s, ir.Splat(ir.Load(ag, a_at(r)), lanes)))
            for x in range(vecs):
                a = acc[r, x]
                body.append(ir.Assign(a, ir.add_product(a, ir.Bin("*", s, bv[x]))))
        return [*head, ir.For(j, zero, cnt, body), *tail]

    tiles: list[ir.Stmt] = []
    blocked: list[ir.Stmt] = []
    if groups:
        at = lambda r: ir.add(ir.mul(ir.add(ir.mul(g, cnt), j), _c(tile)), _c(r))  # noqa: E731
        whole = micro(tile, ir.mul(g, _c(tile)), at, "g")
        if block:
            # ``block`` groups at a time go through every panel of the slab, so their
            # gathered values stay in L2 between panels (all of an item's rows of
            # MoE, 1 MB, do not).
            gb = Var("gb", I64)
            blocks = ir.Bin("/", ir.add(full, _c(block - 1)), _c(block))
            first_g = ir.mul(gb, _c(block))
            last_g = ir.minimum(ir.add(first_g, _c(block)), full)
            panel = ir.For(pn, lo, hi, [ir.For(g, first_g, last_g, whole)])
            blocked.append(ir.For(gb, zero, blocks, [panel]))
        else:
            tiles.append(ir.For(g, zero, full, whole))
        # The rows past the last whole group: one tile of as many rows.
        first = ir.mul(full, _c(tile))
        own_at = lambda r: ir.add(ir.mul(ir.add(first, _c(r)), cnt), j)  # noqa: E731
        for left in range(1, tile):
            tail = micro(left, first, own_at, f"t{left}")
            tiles.append(ir.If(ir.Cmp("==", ir.sub(nr, first), _c(left)), tail))
    else:
        tiles.append(ir.For(row, zero, nr, micro(1, row, lambda r: alone, "s")))
    # The columns past the last whole panel, one at a time from B in place.
    col, total = v.col, Var("sum", elem)
    a_any = ir.Select(
        ir.Cmp("<", row, ir.mul(full, _c(tile))), ir.Load(ag, grouped), ir.Load(ag, alone)
    )
    at_c = ir.add(c_row(row), col)
    term = ir.Bin("*", a_any, ir.Load(b, ir.add(b_row, col)))
    rest = ir.For(
        row,
        zero,
        nr,
        [
            ir.Decl(g, ir.Bin("/", row, _c(tile))),
            ir.For(
                col,
                ir.mul(panels, _c(width)),
                v.n,
                [
                    ir.Decl(total, old_c(ir.Load(c, at_c))),
                    ir.For(j, zero, cnt, [ir.Assign(total, ir.add_product(total, term))]),
                    ir.Store(c, at_c, total),
                ],
            ),
        ],
    )
    slabs = ir.Bin("/", ir.add(panels, _c(slab - 1)), _c(slab))
    return [
        *gather,
        ir.For(
            v.slab,
            zero,
            slabs,
            [
                ir.Decl(lo, ir.mul(v.slab, _c(slab))),
                ir.Decl(hi, ir.minimum(ir.add(lo, _c(slab)), panels)),
                *pack,
                *blocked,
                ir.For(pn, lo, hi, tiles),
            ],
        ),
        rest,
    ]


def _parallel(
    v: _Names,
    items: ir.Expr,
    body: list[ir.Stmt],
    workspaces: list[tuple[ir.Array, int]],
    groups: bool,
    work: ir.Expr,
    threshold: int,
) -> list[ir.Stmt]:
    """The loop over ``items`` in parallel (threads take one at a time: their work
    varies with the mask), each thread with its own ``workspaces`` (and sizes)."""
    width = (VECTORS if groups else SINGLE) * v.lanes
    loop = ir.For(
        Var("item", I64),
        _c(0),
        items,
        body,
        parallel="CPUThread",
        strategy="NoRaces",
        schedule=("dynamic", 1),
        prologue=[ir.Alloc(w, _c(size)) for w, size in workspaces],
        epilogue=[ir.Free(w) for w, _ in workspaces],
        parallel_if=ir.Cmp(">=", work, _c(threshold)),
    )
    return [ir.Decl(v.panels, ir.Bin("/", v.n, _c(width))), loop]


def _matmul_spaces(v: _Names, bh: int, bw: int, depth: int) -> list[tuple[ir.Array, int]]:
    """``function``'s per-thread workspaces and their elements: the step's k's, A's
    values at them and (for blocks of ``ROWS`` rows or more) a packed slab of B."""
    dk = depth_tiles(depth, bw) * bw
    spaces = [(v.kl, dk), (v.ag, bh * dk)]
    if bh >= ROWS:
        spaces.append((v.bg, SLAB * dk * VECTORS * v.lanes))
    return spaces


def _rows_spaces(v: _Names, bt: int, depth: int) -> list[tuple[ir.Array, int]]:
    """``rows_function``'s per-thread workspaces and their elements: the item's tokens
    and gates, its scaled rows of X (``ROWS_D`` d's each) and a packed slab of B."""
    rows = depth_tiles(depth, bt) * bt
    return [
        (v.tl, rows),
        (v.gl, rows),
        (v.ag, rows * ROWS_D),
        (v.bg, ROWS_SLAB * ROWS_D * VECTORS * v.lanes),
    ]


def _bytes(spaces: list[tuple[ir.Array, int]]) -> int:
    return sum(n * SIZES[a.elem] for a, n in spaces)


def matmul_bytes(elem: str, bh: int, bw: int, depth: int) -> int:
    """The bytes of workspace each thread of ``function`` allocates when it starts."""
    return _bytes(_matmul_spaces(_Names(elem), bh, bw, depth))


def rows_bytes(elem: str, bt: int, depth: int) -> int:
    """The bytes of workspace each thread of ``rows_function`` allocates when it starts."""
    return _bytes(_rows_spaces(_Names(elem), bt, depth))


def function(elem: str, idx: str, bh: int, bw: int, depth: int, threshold: int) -> ir.Function:
    """``ucf_condensed_spmm(A, K, pos, crd, B, C, NB, M, KD, N, BS)``: ``C += (A * K) @ B``
    over the live tiles of the stile index (``pos``, ``crd``) of the mask ``K`` (bytes),
    for ``NB`` row-major batches of A and K (``M x KD``) and C (``M x N``); B is ``KD x
    N`` at batch stride ``BS`` (0: one B for every batch). Threads start when the live
    tiles hold at least ``threshold`` multiply-adds."""
    v = _Names(elem)
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
    grid = ir.Bin("/", ir.add(m, _c(bh - 1)), _c(bh))

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
            ir.minimum(ir.add(k0, _c(bw)), kd),
            [ir.Store(kl, cnt, k), ir.Assign(cnt, ir.add(cnt, _c(1)))],
        )
        listing = [
            ir.Decl(cnt, _c(0)),
            ir.For(q, q0, q1, [ir.Decl(k0, ir.mul(load_i(crd, q), _c(bw))), inside]),
        ]

    def masked(r: ir.Expr, tag: str) -> tuple[list[ir.Stmt], ir.Expr]:
        start = Var(f"a_{tag}", I64)
        at = ir.add(start, ir.Load(kl, j))
        value = ir.Bin("*", ir.Load(a, at), ir.Cast(ir.Load(mask, at), elem))
        return [ir.Decl(start, ir.add(arow, ir.mul(r, kd)))], value

    b_row = ir.add(bbase, ir.mul(ir.Load(kl, j), n))
    step = [
        ir.Decl(q0, ir.add(p0, ir.mul(chunk, _c(dt)))),
        ir.Decl(q1, ir.minimum(ir.add(q0, _c(dt)), p1)),
        *listing,
        *_step(v, groups, nr, masked, b_row, lambda r: ir.add(crow, ir.mul(r, n))),
    ]
    block = [
        ir.Decl(bi, ir.Bin("/", t, grid)),
        ir.Decl(r0, ir.mul(ir.sub(t, ir.mul(bi, grid)), _c(bh))),
        ir.Decl(nr, ir.minimum(_c(bh), ir.sub(m, r0))),
        ir.Decl(arow, ir.mul(ir.add(ir.mul(bi, m), r0), kd)),
        ir.Decl(crow, ir.mul(ir.add(ir.mul(bi, m), r0), n)),
        ir.Decl(bbase, ir.mul(bi, bs)),
        ir.Decl(p0, load_i(pos, t)),
        ir.Decl(p1, load_i(pos, ir.add(t, _c(1)))),
        ir.For(chunk, _c(0), ir.Bin("/", ir.add(ir.sub(p1, p0), _c(dt - 1)), _c(dt)), step),
    ]
    # Multiply-adds: the live tiles' elements by B's columns (the pos entry past the
    # last row of tiles counts every live tile).
    work = ir.mul(ir.mul(load_i(pos, ir.mul(nb, grid)), _c(bh * bw)), n)
    params = [
        ir.Param("A", elem, True, doc="the dynamic operand, row-major"),
        ir.Param("K", "u8", True, doc="its mask, bytes 0/1"),
        ir.Param("pos", idx, True, doc="the stile index: segments per row of tiles"),
        ir.Param("crd", idx, True, doc="the stile index: live tile columns"),
        ir.Param("B", elem, True, doc="the dense operand, row-major"),
        ir.Param("C", elem, True, output=True, doc="the output, added into"),
        *(ir.Param(x.name, I64, False) for x in (nb, m, kd, n, bs)),
    ]
    body = _parallel(
        v, ir.mul(nb, grid), block, _matmul_spaces(v, bh, bw, depth), groups, work, threshold
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
    v = _Names(elem)
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
        "/", ir.add(ir.Bin("/", ir.add(tt, _c(bt - 1)), _c(bt)), _c(per - 1)), _c(per)
    )

    def load_i(arr: ir.Array, at: ir.Expr) -> ir.Expr:
        return ir.cast(ir.Load(arr, at), I64)

    gate = ir.add(ir.mul(e, tt), t)
    tokens = [
        ir.Decl(nr, _c(0)),
        ir.For(
            q,
            q0,
            q1,
            [
                ir.Decl(t0, ir.mul(load_i(crd, q), _c(bt))),
                ir.For(
                    t,
                    t0,
                    ir.minimum(ir.add(t0, _c(bt)), tt),
                    [
                        ir.Store(tl, nr, t),
                        ir.Store(
                            gl,
                            nr,
                            ir.Bin("*", ir.Load(r, gate), ir.Cast(ir.Load(mask, gate), elem)),
                        ),
                        ir.Assign(nr, ir.add(nr, _c(1))),
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
    reads_c = ir.Logic("or", ir.Cmp("==", overwrite, _c(0)), ir.Cmp(">", step, _c(0)))
    steps = ir.For(
        step,
        _c(0),
        ir.Bin("/", ir.add(d, _c(dk - 1)), _c(dk)),
        [
            ir.Decl(d0, ir.mul(step, _c(dk))),
            ir.Decl(cnt, ir.minimum(_c(dk), ir.sub(d, d0))),
            *_step(v, groups, nr, scaled, b_row, c_row, slab, reads_c, GATHERED_ROWS, ROWS_BLOCK),
        ],
    )
    body = [
        # Items go part-major (every batch's first part, then every second part, ...), so
        # the last items the threads take are later parts of batches that have several
        # rather than whole batches: for bench/stile.py's MoE at a depth of 512 a model
        # of two threads taking items in turn put the makespan 3-4 % nearer the ideal.
        ir.Decl(e, ir.Bin("%", item, nb)),
        ir.Decl(p0, load_i(pos, e)),
        ir.Decl(p1, load_i(pos, ir.add(e, _c(1)))),
        # The batch's live tiles in equal parts of at most ``per``: no part is a sliver
        # left over.
        ir.Decl(
            parts, ir.Bin("max", ir.Bin("/", ir.add(ir.sub(p1, p0), _c(per - 1)), _c(per)), _c(1))
        ),
        ir.Decl(size, ir.Bin("/", ir.add(ir.sub(p1, p0), ir.sub(parts, _c(1))), parts)),
        ir.Decl(q0, ir.add(p0, ir.mul(ir.Bin("/", item, nb), size))),
        ir.Decl(q1, ir.minimum(ir.add(q0, size), p1)),
        ir.If(ir.Cmp("<", q0, q1), [*tokens, steps]),
    ]
    spaces = _rows_spaces(v, bt, depth)
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
    work = ir.mul(ir.mul(ir.mul(load_i(pos, nb), _c(bt)), d), n)
    loop = _parallel(v, ir.mul(nb, items_per), body, spaces, groups, work, threshold)
    zeros = _zero_dead_rows(mask, v.c, bt, nb, tt, n, threshold)
    doc = f"C[e] += (R * K)[e] X @ B[e] over the live tiles of {bt} tokens, {rows} per item"
    return ir.Function(
        f"ucf_condensed_rows_{bt}",
        params,
        [ir.If(ir.Cmp("==", overwrite, _c(2)), zeros), *loop],
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
        ir.Decl(end, ir.minimum(ir.add(t, _c(bt)), tt)),
        ir.Decl(live, _c(0)),
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
            ir.Logic("and", ir.Cmp("!=", live, _c(0)), ir.Cmp(">=", start, _c(0))),
            [*clear, ir.Assign(start, _c(-1))],
        ),
        ir.If(
            ir.Logic("and", ir.Cmp("==", live, _c(0)), ir.Cmp("<", start, _c(0))),
            [ir.Assign(start, row)],
        ),
        ir.Assign(t, end),
    ]
    body = [
        ir.Decl(e, ir.Bin("/", zi, blocks)),
        ir.Decl(first, ir.mul(ir.sub(zi, ir.mul(e, blocks)), _c(per * bt))),
        ir.Decl(last, ir.minimum(ir.add(first, _c(per * bt)), tt)),
        ir.Decl(start, _c(-1)),
        ir.Decl(t, first),
        ir.While(ir.Cmp("<", t, last), tile),
        ir.If(ir.Cmp(">=", start, _c(0)), clear),
    ]
    return [
        ir.Decl(tiles, ir.Bin("/", ir.add(tt, _c(bt - 1)), _c(bt))),
        ir.Decl(blocks, ir.Bin("/", ir.add(tiles, _c(per - 1)), _c(per))),
        ir.For(
            zi,
            _c(0),
            ir.mul(nb, blocks),
            body,
            parallel="CPUThread",
            strategy="NoRaces",
            schedule=("dynamic", 1),
            parallel_if=ir.Cmp(">=", ir.mul(ir.mul(nb, tt), n), _c(threshold)),
        ),
    ]
