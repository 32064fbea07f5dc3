"""The index of nonzero micro-tiles built on CUDA: SparDA's online index, whose threads
claim the next slot of a live tile's row with ``atomicAdd``, as three kernels and
their launcher in the GPU mapping's IR (``ucf.ir.gpu_nodes``), run on a GPU through
pycuda or on the CPU emulator of generated CUDA.

Apart from the CPU builder (``ucf.stile.index_kernel``) because nothing but the mask
comparison is shared: the CUDA builder takes the tile extents at run time (one nvcc
build serves every tile shape), scans in one block, and fills rows in any order.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from ucf.ir import nodes as ir
from ucf.ir.gpu_nodes import Launch, Module, Special
from ucf.stile.index_kernel import compare_type, compared_zero

#: Threads per block of the CUDA builder's kernels.
CUDA_THREADS = 256


def _cuda_module(mask_type: str, idx: str, order: int) -> Module:
    """The CUDA index builder: SparDA's online index, with ``atomicAdd`` slot claims.

    The launcher ``ucf_stile_index_<order>d_launch(mask, D0, ..., B0, ..., flags, pos,
    next, crd)`` takes the arguments of ``_function``, the tile extents ``B0, ...`` (at
    run time, unlike the CPU builder's: one nvcc build serves every tile shape) and
    ``next`` (one per row of tiles), and runs three kernels:

    1. ``mark``, a thread per mask element: a nonzero whose tile's flag still reads 0
       adds 1 to the flag; the one thread that saw the old value 0 counts the tile
       into ``pos[row + 1]`` (an atomic add);
    2. ``scan``, one block: the prefix sum of the counts, leaving each row's start in
       ``pos[row]`` and ``next[row]`` (``_block_scan``);
    3. ``fill``, a thread per tile: a live tile claims the next slot of its row with
       ``atomicAdd(&next[row], 1)`` and writes its column there, so the columns of a
       row land in whatever order the threads ran: what a ``Q`` level allows.
    """
    i64, i32 = ir.I64, "i32"
    r = order
    mask = ir.Array("mask", mask_type)
    flags = ir.Array("flags", i32, output=True)
    pos = ir.Array("pos", idx, output=True)
    nxt = ir.Array("next", idx, output=True)
    crd = ir.Array("crd", idx, output=True)
    dims = [ir.Var(f"D{m}", i64) for m in range(r)]
    *lead, bw = tiles = [ir.Var(f"B{m}", i64) for m in range(r)]
    params = [
        ir.Param("mask", mask_type, True, doc="the mask, row-major"),
        *(ir.Param(d.name, i64, False) for d in dims),
        *(ir.Param(b.name, i64, False, doc="a tile's extent") for b in tiles),
        ir.Param("flags", i32, True, output=True, doc="zeroed, one per tile"),
        ir.Param("pos", idx, True, output=True, doc="zeroed, rows of tiles + 1"),
        ir.Param("next", idx, True, output=True, doc="one per row of tiles"),
        ir.Param("crd", idx, True, output=True, doc="one slot per tile at least"),
    ]
    args = [mask, *dims, *tiles, flags, pos, nxt, crd]
    one = ir.Const(1, i64)

    def ceil_div(a: ir.Expr, b: ir.Expr) -> ir.Expr:
        return ir.Bin("/", ir.sub(ir.add(a, b), one), b)

    grid = [ir.Var(f"G{m}", i64) for m in range(r - 1)]
    size, rows, kbv = ir.Var("size", i64), ir.Var("R", i64), ir.Var("Kb", i64)
    total: ir.Expr = dims[-1]
    for d in dims[:-1]:
        total = ir.mul(total, d)
    count: ir.Expr = one
    for g in grid:
        count = ir.mul(count, g)
    extents = [
        *(ir.Decl(g, ceil_div(d, b)) for g, d, b in zip(grid, dims, lead, strict=False)),
        ir.Decl(size, total),
        ir.Decl(rows, count),
        ir.Decl(kbv, ceil_div(dims[-1], bw)),
    ]
    gid = ir.Var("gid", i64)
    thread = ir.Decl(
        gid,
        ir.add(ir.mul(Special("blockIdx.x"), ir.Const(CUDA_THREADS, i64)), Special("threadIdx.x")),
    )

    # mark: the element's coordinates, its tile's row and column, then the flag.
    coords: list[ir.Stmt] = []
    rest: ir.Expr = gid
    for m in reversed(range(r)):
        c = ir.Var(f"c{m}", i64)
        coords.append(ir.Decl(c, ir.Bin("%", rest, dims[m]) if m else rest))
        if m:
            coords.append(ir.Decl(ir.Var(f"x{m}", i64), ir.Bin("/", rest, dims[m])))
            rest = ir.Var(f"x{m}", i64)
    row: ir.Expr = ir.Const(0, i64)
    for m in range(r - 1):
        tile_m = ir.Bin("/", ir.Var(f"c{m}", i64), lead[m])
        row = ir.add(ir.mul(row, grid[m]), tile_m)
    rv, tv, old = ir.Var("row", i64), ir.Var("tile", i64), ir.Var("old", i32)
    col = ir.Bin("/", ir.Var(f"c{r - 1}", i64), bw)
    live = ir.Cmp(
        "!=", ir.cast(ir.Load(mask, gid), compare_type(mask_type)), compared_zero(mask_type)
    )
    claim = ir.If(
        ir.Cmp("==", ir.Load(flags, tv), ir.Const(0, i32)),
        [
            ir.FetchAdd(old, flags, tv, ir.Const(1, i32)),
            ir.If(
                ir.Cmp("==", old, ir.Const(0, i32)),
                [ir.Store(pos, ir.add(rv, one), ir.Const(1, idx), True, atomic=True)],
            ),
        ],
    )
    mark = [
        thread,
        ir.If(
            ir.land(ir.Cmp("<", gid, size), live),
            [
                *coords,
                ir.Decl(rv, row),
                ir.Decl(tv, ir.add(ir.mul(rv, kbv), col)),
                claim,
            ],
        ),
    ]
    scan = _block_scan(pos, nxt, rows, idx)
    slot = ir.Var("slot", idx)
    fill = [
        thread,
        ir.If(
            ir.land(
                ir.Cmp("<", gid, ir.mul(rows, kbv)),
                ir.Cmp("!=", ir.Load(flags, gid), ir.Const(0, i32)),
            ),
            [
                ir.FetchAdd(slot, nxt, ir.Bin("/", gid, kbv), ir.Const(1, idx)),
                ir.Store(crd, ir.cast(slot, i64), ir.cast(ir.Bin("%", gid, kbv), idx)),
            ],
        ),
    ]
    name = f"ucf_stile_index_{r}d"
    parts = (
        ("mark", mark, size, "flag and count the live tiles, a thread per mask element"),
        ("scan", scan, None, "the rows' segments from their counts, one block"),
        ("fill", fill, ir.mul(rows, kbv), "each live tile claims a slot of its row"),
    )
    kernels, launches = [], []
    for part, body, threads, what in parts:
        body = [*_used(extents, body), *body]
        kernels.append(ir.Function(f"{name}_{part}", params, body, doc=f"{part}: {what}."))
        grid = ceil_div(threads, ir.Const(CUDA_THREADS, i64)) if threads is not None else one
        launches.append(Launch(f"{name}_{part}", [grid], CUDA_THREADS, args))
    doc = f"The index of the nonzero tiles of a {r}-mode mask, with atomic slot claims."
    host = ir.Function(f"{name}_launch", params, [*extents, *launches], doc=doc)
    return Module(kernels, host)


def _block_scan(pos: ir.Array, nxt: ir.Array, rows: ir.Var, idx: str) -> list[ir.Stmt]:
    """One block's prefix sum of the ``rows`` counts in ``pos[1:]``, in place, with each
    row's start also in ``next``: each thread sums a chunk of consecutive rows, the
    chunk totals (parked in ``next``, which has a slot per chunk since a chunk holds a
    row at least) give each thread its offset, and it adds that to its chunk. One block
    serves: the rows of tiles are far fewer than the elements the other kernels spread
    over the grid (a 4096 x 4096 mask has 4096 rows of tiles at most)."""
    i64 = ir.I64
    tid, k, j = Special("threadIdx.x"), ir.Var("k", i64), ir.Var("j", i64)
    chunk, lo, hi = ir.Var("chunk", i64), ir.Var("lo", i64), ir.Var("hi", i64)
    acc, off = ir.Var("acc", idx), ir.Var("off", idx)
    one, width = ir.Const(1, i64), ir.Const(CUDA_THREADS, i64)
    sync = ir.Call("__syncthreads", [])
    nchunks = ir.Bin("/", ir.sub(ir.add(rows, chunk), one), chunk)
    return [
        ir.Decl(chunk, ir.Bin("max", ir.Bin("/", ir.sub(ir.add(rows, width), one), width), one)),
        ir.Decl(lo, ir.minimum(ir.mul(tid, chunk), rows)),
        ir.Decl(hi, ir.minimum(ir.add(lo, chunk), rows)),
        ir.Decl(acc, ir.Const(0, idx)),
        ir.For(
            k,
            lo,
            hi,
            [
                ir.Assign(acc, ir.add(acc, ir.Load(pos, ir.add(k, one)))),
                ir.Store(pos, ir.add(k, one), acc),
            ],
        ),
        ir.If(ir.Cmp("<", lo, hi), [ir.Store(nxt, tid, acc)]),
        sync,
        ir.Decl(off, ir.Const(0, idx)),
        ir.For(
            j,
            ir.Const(0, i64),
            ir.minimum(tid, nchunks),
            [ir.Assign(off, ir.add(off, ir.Load(nxt, j)))],
        ),
        sync,
        ir.For(
            k,
            lo,
            hi,
            [
                ir.Store(nxt, k, ir.Select(ir.Cmp("==", k, lo), off, ir.Load(pos, k))),
                ir.Store(pos, ir.add(k, one), ir.add(ir.Load(pos, ir.add(k, one)), off)),
            ],
        ),
    ]


def _used(decls: list[ir.Decl], body: list[ir.Stmt]) -> list[ir.Decl]:
    """The declarations ``body`` reads, directly or through a later one of them."""
    from ucf.ir.walk import names

    wanted = names(body)
    kept = []
    for d in reversed(decls):
        if d.var.name in wanted:
            kept.append(d)
            wanted |= names(d.init)
    return kept[::-1]


def cuda_source(mask_type: str, idx: str, order: int) -> str:
    """The ``.cu`` text of the CUDA index builder for masks of ``order`` modes of IR
    type ``mask_type`` and an index of IR type ``idx``."""
    from ucf.codegen import cuda

    title = f"stile_index of a {mask_type} mask of {order} modes, {idx} index"
    return cuda.source(_cuda_module(mask_type, idx, order), title)


@cache
def compiled_cuda(mask_type: str, idx: str, order: int, emulate: bool) -> Any:
    """The CUDA builder's launcher: on the CPU emulator, or on the GPU through pycuda
    (built at its first call, which says what is missing on a machine without one)."""
    from ucf.toolchain import cache as kcache
    from ucf.toolchain import cuda_build

    source = cuda_source(mask_type, idx, order)
    host = _cuda_module(mask_type, idx, order).host
    fields = {"stile_index_cuda": source}
    if not emulate:
        return cuda_build.Device(source, fields, host.name, host.params)
    lib = kcache.library(
        {**fields, **cuda_build.emulation_identity()},
        lambda: cuda_build.build_emulated(source),
    )
    return cuda_build.Emulated(lib, host.name, host.params)
