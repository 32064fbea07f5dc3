"""The shared core of the gathered compute tiles (``ucf.stile.kernels``): their tile
sizes, the micro-kernel's step over one gathered depth of live k's, the parallel loop
over blocks of rows, and the bytes of the workspaces each thread holds.
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


class Names:
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


def c64(v: int) -> Const:
    return Const(v, I64)


def gathered_step(
    v: Names,
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
    zero = c64(0)
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
    grouped = ir.add(ir.mul(ir.add(ir.mul(g, cnt), j), c64(tile)), ir.Bin("%", row, c64(tile)))
    alone = ir.add(ir.mul(row, cnt), j)
    rows = [a_row(ir.add(ir.mul(g, c64(tile)), c64(r)), f"r{r}") for r in range(tile)]
    group_at = ir.mul(ir.add(ir.mul(g, cnt), j), c64(tile))
    own, value = a_row(row, "s")
    gather = [
        ir.Decl(full, ir.Bin("/", nr, c64(tile)) if groups else zero),
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
                    [ir.Store(ag, ir.add(group_at, c64(r)), x) for r, (_, x) in enumerate(rows)],
                ),
            ],
        ),
        ir.For(
            row,
            ir.mul(full, c64(tile)),
            nr,
            [*own, ir.For(j, zero, cnt, [ir.Store(ag, alone, value)])],
        ),
    ]
    pack: list[ir.Stmt] = []
    packed_at = ir.mul(ir.add(ir.mul(ir.sub(pn, lo), cnt), j), c64(width))
    if groups:
        # A slab of SLAB panels of the step's rows of B, k after k (each row's part
        # read in order, which the prefetchers follow), stored panel by panel.
        src = ir.add(b_row, ir.mul(pn, c64(width)))
        copy = [
            ir.Store(
                bg,
                ir.add(packed_at, c64(x * lanes)),
                ir.VLoad(b, ir.add(src, c64(x * lanes)), lanes),
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
                ir.add(c_row(ir.add(first, c64(r))), ir.mul(pn, c64(width))), c64(x * lanes)
            )
            for r, x in acc
        }
        head = [ir.Decl(a, old_c(ir.VLoad(c, places[key], lanes))) for key, a in acc.items()]
        tail = [ir.Store(c, places[key], a) for key, a in acc.items()]
        bv = [Var(f"{prefix}b{x}", ir.vector(elem, lanes)) for x in range(vecs)]
        if groups:
            at = [ir.add(packed_at, c64(x * lanes)) for x in range(vecs)]
            loads = [ir.Decl(y, ir.VLoad(bg, p, lanes)) for y, p in zip(bv, at, strict=True)]
        else:
            src = ir.add(b_row, ir.mul(pn, c64(width)))
            loads = [
                ir.Decl(y, ir.VLoad(b, ir.add(src, c64(x * lanes)), lanes))
                for x, y in enumerate(bv)
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
        at = lambda r: ir.add(ir.mul(ir.add(ir.mul(g, cnt), j), c64(tile)), c64(r))  # noqa: E731
        whole = micro(tile, ir.mul(g, c64(tile)), at, "g")
        if block:
            # ``block`` groups at a time go through every panel of the slab, so their
            # gathered values stay in L2 between panels (all of an item's rows of
            # MoE, 1 MB, do not).
            gb = Var("gb", I64)
            blocks = ir.Bin("/", ir.add(full, c64(block - 1)), c64(block))
            first_g = ir.mul(gb, c64(block))
            last_g = ir.minimum(ir.add(first_g, c64(block)), full)
            panel = ir.For(pn, lo, hi, [ir.For(g, first_g, last_g, whole)])
            blocked.append(ir.For(gb, zero, blocks, [panel]))
        else:
            tiles.append(ir.For(g, zero, full, whole))
        # The rows past the last whole group: one tile of as many rows.
        first = ir.mul(full, c64(tile))
        own_at = lambda r: ir.add(ir.mul(ir.add(first, c64(r)), cnt), j)  # noqa: E731
        for left in range(1, tile):
            tail = micro(left, first, own_at, f"t{left}")
            tiles.append(ir.If(ir.Cmp("==", ir.sub(nr, first), c64(left)), tail))
    else:
        tiles.append(ir.For(row, zero, nr, micro(1, row, lambda r: alone, "s")))
    # The columns past the last whole panel, one at a time from B in place.
    col, total = v.col, Var("sum", elem)
    a_any = ir.Select(
        ir.Cmp("<", row, ir.mul(full, c64(tile))), ir.Load(ag, grouped), ir.Load(ag, alone)
    )
    at_c = ir.add(c_row(row), col)
    term = ir.Bin("*", a_any, ir.Load(b, ir.add(b_row, col)))
    rest = ir.For(
        row,
        zero,
        nr,
        [
            ir.Decl(g, ir.Bin("/", row, c64(tile))),
            ir.For(
                col,
                ir.mul(panels, c64(width)),
                v.n,
                [
                    ir.Decl(total, old_c(ir.Load(c, at_c))),
                    ir.For(j, zero, cnt, [ir.Assign(total, ir.add_product(total, term))]),
                    ir.Store(c, at_c, total),
                ],
            ),
        ],
    )
    slabs = ir.Bin("/", ir.add(panels, c64(slab - 1)), c64(slab))
    return [
        *gather,
        ir.For(
            v.slab,
            zero,
            slabs,
            [
                ir.Decl(lo, ir.mul(v.slab, c64(slab))),
                ir.Decl(hi, ir.minimum(ir.add(lo, c64(slab)), panels)),
                *pack,
                *blocked,
                ir.For(pn, lo, hi, tiles),
            ],
        ),
        rest,
    ]


def row_blocks(
    v: Names,
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
        c64(0),
        items,
        body,
        parallel="CPUThread",
        strategy="NoRaces",
        schedule=("dynamic", 1),
        prologue=[ir.Alloc(w, c64(size)) for w, size in workspaces],
        epilogue=[ir.Free(w) for w, _ in workspaces],
        parallel_if=ir.Cmp(">=", work, c64(threshold)),
    )
    return [ir.Decl(v.panels, ir.Bin("/", v.n, c64(width))), loop]


def matmul_spaces(v: Names, bh: int, bw: int, depth: int) -> list[tuple[ir.Array, int]]:
    """``function``'s per-thread workspaces and their elements: the step's k's, A's
    values at them and (for blocks of ``ROWS`` rows or more) a packed slab of B."""
    dk = depth_tiles(depth, bw) * bw
    spaces = [(v.kl, dk), (v.ag, bh * dk)]
    if bh >= ROWS:
        spaces.append((v.bg, SLAB * dk * VECTORS * v.lanes))
    return spaces


def rows_spaces(v: Names, bt: int, depth: int) -> list[tuple[ir.Array, int]]:
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
    return _bytes(matmul_spaces(Names(elem), bh, bw, depth))


def rows_bytes(elem: str, bt: int, depth: int) -> int:
    """The bytes of workspace each thread of ``rows_function`` allocates when it starts."""
    return _bytes(rows_spaces(Names(elem), bt, depth))
