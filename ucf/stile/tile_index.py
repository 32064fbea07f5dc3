"""SparDA's online index of nonzero micro-tiles (``ucf.stile_index``), built by a kernel.

Dynamic sparsity is known only when a call comes: a ReLU's zeros, a routing mask.
SparDA (PIT) builds, every call, the index of the micro-tiles (say 32 x 1) of a
mask that hold a nonzero, and lets the compute gather those tiles of the dense
data in place.  Over a permutation-invariant variable (``ucf.invariance``) the
tiles may be listed in any order, so the index is built without sorting: here
one thread per row of tiles marks and counts its live tiles, a prefix sum over
the counts gives each row its segment, and the threads fill their segments in
parallel.  The result is a ucf Tensor over the grid of tiles whose tile-column
level is unordered compressed (``Q``): a ucf kernel reads it directly, driving
the loop over tiles while the dense data is located in place (no copy), as in::

    T = ucf.stile_index(mask, (bh, bw))
    A4 = A.reshape(M // bh, bh, K // bw, bw)  # a view: A is not copied
    k = ucf.compile("C(i,a,n) = T(i,k) * A(i,a,k,b) * B(k,b,n)", {"T": "UQ"})

The kernel is generated as LLIR (``ucf.ir``) and compiled like any ucf kernel,
by the LLVM JIT (``llvm``) or the C compiler (``c``). On CUDA the index is SparDA's
online one: threads that find a live tile claim the next slot of its row with
``atomicAdd`` (``_cuda_module``), run on a GPU or on the CPU emulator of generated CUDA.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

import numpy as np

from ucf.errors import OperandError, UnsupportedError, boundary
from ucf.format.format import Format
from ucf.format.tensor import Tensor
from ucf.format.values import index_dtype_of
from ucf.ir import nodes as ir
from ucf.ir.gpu_nodes import Launch, Module, Special
from ucf.lower import work

#: Where the index builds from LLIR on the CPU, and where dynamic kernels run.
TARGETS = ("llvm", "c")
#: Where ``stile_index`` runs: the CPU targets, and CUDA (a GPU, or its emulator).
INDEX_TARGETS = (*TARGETS, "cuda")


def _function(
    mask_type: str, idx: str, granularity: tuple[int, ...], threshold: int = 0
) -> ir.Function:
    """``stile_index(mask, D0, ..., flags, pos, crd)`` over a row-major mask of extents
    ``D0 x D1 x ...`` cut into ``granularity`` tiles: ``flags`` (zeroed, one per tile)
    marks live tiles, ``pos`` (zeroed, one more than the rows of tiles: the tiles of
    every mode but the last) gets the segment bounds and ``crd`` (at least one slot
    per live tile) the tile columns. Threads start only for masks of at least
    ``threshold`` elements (waking them costs more than a small mask's scan)."""
    i64 = ir.I64
    r = len(granularity)
    *lead, bw = granularity
    mask = ir.Array("mask", mask_type)
    flags = ir.Array("flags", "i32", output=True)
    pos = ir.Array("pos", idx, output=True)
    crd = ir.Array("crd", idx, output=True)
    dims = [ir.Var(f"D{m}", i64) for m in range(r)]
    grid = [ir.Var(f"G{m}", i64) for m in range(r - 1)]
    rows, cols = ir.Var("I", i64), ir.Var("J", i64)
    c, q, n, rest = (ir.Var(x, i64) for x in ("c", "q", "n", "rest"))
    zero, one = ir.Const(0, i64), ir.Const(1, i64)

    def ceil_div(a: ir.Expr, b: int) -> ir.Expr:
        return ir.Bin("/", ir.add(a, ir.Const(b - 1, i64)), ir.Const(b, i64))

    kbv, nrows, row = ir.Var("Kb", i64), ir.Var("R", i64), ir.Var("row", i64)
    base = ir.mul(rows, kbv)
    flag_at = ir.add(base, ir.Bin("/", c, ir.Const(bw, i64)))
    live = ir.Cmp(
        "!=", ir.cast(ir.Load(mask, ir.add(row, c)), _compute(mask_type)), _zero(mask_type)
    )
    scan: list[ir.Stmt] = [
        ir.Decl(row, ir.mul(ir.Var(f"L{r - 2}", i64), dims[-1]) if r > 1 else zero),
        ir.For(
            c,
            zero,
            dims[-1],
            [
                ir.Store(
                    flags, flag_at, ir.Bin("max", ir.Load(flags, flag_at), ir.Cast(live, "i32"))
                )
            ],
        ),
    ]
    if bw > 1:
        # A tile's elements of the row are or-ed into a register and its flag written once:
        # the loop above stores to one flag bw times over, which no compiler vectorizes.
        k, acc = ir.Var("k", i64), ir.Var("acc", "i32")
        start = ir.mul(k, ir.Const(bw, i64))
        tile_flag = ir.add(base, k)
        scan[1] = ir.For(
            k,
            zero,
            ceil_div(dims[-1], bw),
            [
                ir.Decl(acc, ir.Const(0, "i32")),
                ir.For(
                    c,
                    start,
                    ir.minimum(ir.add(start, ir.Const(bw, i64)), dims[-1]),
                    [ir.Assign(acc, ir.Bin("max", acc, ir.Cast(live, "i32")))],
                ),
                ir.Store(flags, tile_flag, ir.Bin("max", ir.Load(flags, tile_flag), acc)),
            ],
        )
    # The elements of a row of tiles: one loop per leading mode over the tile's extent
    # in it (cut at the mask's edge), the linear row index built as the loops nest.
    tile: list[ir.Stmt] = [ir.Decl(rest, rows)]
    for m in reversed(range(r - 1)):
        t = ir.Var(f"T{m}", i64)
        tile += [
            ir.Decl(t, ir.Bin("%", rest, grid[m])),
            ir.Assign(rest, ir.Bin("/", rest, grid[m])),
        ]
    for m in reversed(range(r - 1)):
        e, t, g = ir.Var(f"E{m}", i64), ir.Var(f"T{m}", i64), ir.Const(lead[m], i64)
        lin = ir.Var(f"L{m}", i64)
        outer = ir.add(ir.mul(ir.Var(f"L{m - 1}", i64), dims[m]), e) if m else e
        scan = [
            ir.For(
                e,
                ir.mul(t, g),
                ir.minimum(ir.mul(ir.add(t, one), g), dims[m]),
                [ir.Decl(lin, outer), *scan],
            )
        ]
    at = ir.add(base, cols)
    count = [
        ir.Decl(n, zero),
        ir.For(cols, zero, kbv, [ir.Assign(n, ir.add(n, ir.cast(ir.Load(flags, at), i64)))]),
        ir.Store(pos, ir.add(rows, one), ir.cast(n, idx)),
    ]
    prefix = ir.For(
        rows,
        zero,
        nrows,
        [
            ir.Store(
                pos, ir.add(rows, one), ir.add(ir.Load(pos, ir.add(rows, one)), ir.Load(pos, rows))
            )
        ],
    )
    fill = [
        ir.Decl(q, ir.cast(ir.Load(pos, rows), i64)),
        ir.For(
            cols,
            zero,
            kbv,
            [
                ir.If(
                    ir.Cmp("!=", ir.Load(flags, at), ir.Const(0, "i32")),
                    [ir.Store(crd, q, ir.cast(cols, idx)), ir.Assign(q, ir.add(q, one))],
                )
            ],
        ),
    ]
    size: ir.Expr = dims[-1]
    for d in dims[:-1]:
        size = ir.mul(size, d)

    def per_row(body: list[ir.Stmt]) -> ir.For:
        return ir.For(
            rows,
            zero,
            nrows,
            body,
            parallel="CPUThread",
            strategy="NoRaces",
            parallel_if=ir.Cmp(">=", size, ir.Const(threshold, i64)),
        )

    params = [
        ir.Param("mask", mask_type, True, doc="the mask, row-major"),
        *(ir.Param(d.name, i64, False) for d in dims),
        ir.Param("flags", "i32", True, output=True, doc="zeroed, one per tile"),
        ir.Param("pos", idx, True, output=True, doc="zeroed, rows of tiles + 1"),
        ir.Param("crd", idx, True, output=True, doc="one slot per tile at least"),
    ]
    count_rows: ir.Expr = one
    decls: list[ir.Stmt] = []
    for m in range(r - 1):
        decls.append(ir.Decl(grid[m], ceil_div(dims[m], lead[m])))
        count_rows = ir.mul(count_rows, grid[m])
    body = [
        *decls,
        ir.Decl(nrows, count_rows),
        ir.Decl(kbv, ceil_div(dims[-1], bw)),
        per_row([*tile, *scan, *count]),
        prefix,
        per_row(fill),
    ]
    shape = "x".join(map(str, granularity))
    doc = f"the index of the nonzero {shape} tiles of a mask"
    return ir.Function(f"ucf_stile_index_{shape}", params, body, doc=doc)


def _compute(mask_type: str) -> str:
    """The type a mask element is compared in (storage types load as a wider one)."""
    return {"f16": "f32", "i8": "i32", "u8": "i32"}.get(mask_type, mask_type)


def _zero(mask_type: str) -> ir.Const:
    t = _compute(mask_type)
    return ir.Const(0.0 if t.startswith("f") else 0, t)


@cache
def _compiled(
    target: str, mask_type: str, idx: str, granularity: tuple[int, ...], threshold: int
) -> Any:
    """The index kernel as a ctypes function, built once per process and shape of tile."""
    return compiled_function(target, _function(mask_type, idx, granularity, threshold))


def compiled_function(target: str, fn: ir.Function) -> tuple[Any, Any]:
    """``fn`` compiled for ``target`` (llvm or c) as a ctypes function taking pointers
    and int64s, and the library that holds it (keep it alive while calling): built once
    per process, and kept in ucf's disk cache (object code or shared library)."""
    from ucf.toolchain import cache as kcache

    if target == "llvm":
        from ucf.codegen import llvm as llvmgen
        from ucf.toolchain import jit

        jit.openmp_runtime()
        text = llvmgen.module([fn])
    else:
        from ucf.codegen import c as cgen
        from ucf.toolchain.jit import openmp_runtime

        openmp_runtime()
        text = cgen.source([fn])
    if (target, text) not in _COMPILED:
        _COMPILED[target, text] = _build(target, fn, text, kcache)
    return _COMPILED[target, text]


#: Compiled functions of this process by target and source text.
_COMPILED: dict[tuple[str, str], tuple[Any, Any]] = {}


def _build(target: str, fn: ir.Function, text: str, kcache: Any) -> tuple[Any, Any]:
    scalars = {"f32": ctypes.c_float, "f64": ctypes.c_double}
    types = [
        ctypes.c_void_p if p.is_array else scalars.get(p.type, ctypes.c_int64) for p in fn.params
    ]
    if target == "llvm":
        from ucf.toolchain import jit

        fields = {fn.name: text, **jit.identity()}
        name = f"{kcache.key(fields)}.o"
        obj = kcache.load(name, fields)
        if obj is None:
            library = jit.compile_ir(text)
            kcache.store(name, fields, library.object_code)
        else:
            library = jit.load_object(obj)
        call = ctypes.CFUNCTYPE(None, *types)(library.address(fn.name))
        return call, library
    from ucf.toolchain import cc

    library = kcache.library({fn.name: text, **cc.identity()}, lambda: cc.build_shared(text))
    call = getattr(library, fn.name)
    call.argtypes, call.restype = types, None
    return call, library


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
    live = ir.Cmp("!=", ir.cast(ir.Load(mask, gid), _compute(mask_type)), _zero(mask_type))
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
def _compiled_cuda(mask_type: str, idx: str, order: int, emulate: bool) -> Any:
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


@boundary
def stile_index(
    mask: Any,
    granularity: tuple[int, ...],
    target: str = "llvm",
    dtype: Any = np.float32,
    index_dtype: Any = "int32",
    emulate: bool = False,
) -> Tensor:
    """The nonzero ``granularity`` micro-tiles of ``mask`` as a ``U...UQ`` Tensor.

    ``granularity`` has one tile extent per mode of the mask. The tensor's shape is
    the grid of tiles (the last tile of a mode may be partial); entry (I, ..., J) is
    stored, with value 1, when that tile of the mask holds a nonzero. The tiles of
    every mode but the last are dense levels; within one of their rows the tile
    columns come in whatever order the kernel wrote them (the last level is
    unordered: ``Q``). ``target`` is ``"llvm"``, ``"c"`` or ``"cuda"`` (a GPU through
    pycuda, or with ``emulate=True`` the CPU emulator of generated CUDA). A mask that
    is not C-contiguous is copied into one first.
    """
    a = mask_array(mask, "stile_index: the mask")
    g = check_granularity(granularity, a.ndim, "stile_index")
    return build(a, g, target, dtype, index_dtype, emulate)


def mask_array(mask: Any, what: str) -> np.ndarray:
    """``mask`` as a C-contiguous array the kernel reads (booleans as bytes)."""
    a = np.asarray(mask)
    if a.ndim == 0:
        raise OperandError(f"{what} must have at least one mode, got a scalar")
    if a.dtype == np.bool_:
        a = a.view(np.uint8)
    if a.dtype.name not in ir.NUMPY_TO_IR:
        raise OperandError(f"{what} has dtype {a.dtype}, which a mask cannot have")
    return np.ascontiguousarray(a)


def check_granularity(granularity: Any, order: int, who: str) -> tuple[int, ...]:
    """``granularity`` as a tuple of ``order`` positive ints, else an OperandError."""
    g = tuple(granularity) if isinstance(granularity, tuple | list) else ()
    if len(g) != order or not all(
        isinstance(x, int | np.integer) and not isinstance(x, bool) and x >= 1 for x in g
    ):
        raise OperandError(
            f"{who}: the granularity must be {order} positive integers (one tile extent "
            f"per mode), got {granularity!r}"
        )
    return tuple(int(x) for x in g)


def build(
    mask: np.ndarray,
    granularity: tuple[int, ...],
    target: str = "llvm",
    dtype: Any = np.float32,
    index_dtype: Any = "int32",
    emulate: bool = False,
    ordered: bool = False,
) -> Tensor:
    """The index of a checked C-contiguous ``mask`` (see ``stile_index``): what dynamic
    kernels call on every call. ``ordered`` labels it with ``index_format`` (what a
    dynamic kernel compiled with that format takes); else it is ``Format.dynamic``, as
    ``stile_index`` documents on every target."""
    if target not in INDEX_TARGETS:
        raise UnsupportedError(f"stile_index runs on {', '.join(INDEX_TARGETS)}, not {target!r}")
    if emulate and target != "cuda":
        raise UnsupportedError(
            "stile_index: emulate=True runs generated CUDA and needs target='cuda'"
        )
    idt = index_dtype_of(index_dtype)
    grid = tuple(-(-n // b) for n, b in zip(mask.shape, granularity, strict=True))
    rows, kb = int(np.prod(grid[:-1], dtype=np.int64)), grid[-1]
    if rows * kb > np.iinfo(idt).max:
        raise OperandError(f"stile_index: {rows * kb} tiles do not fit index dtype {idt}")
    types = ir.NUMPY_TO_IR[mask.dtype.name], ir.NUMPY_TO_IR[idt.name]
    flags = np.zeros(rows * kb, dtype=np.int32)
    pos = np.zeros(rows + 1, dtype=idt)
    crd = np.empty(max(rows * kb, 1), dtype=idt)
    if target == "cuda":
        run = _compiled_cuda(*types, mask.ndim, emulate)
        run(mask, *mask.shape, *granularity, flags, pos, np.empty(max(rows, 1), dtype=idt), crd)
    else:
        call, _ = _compiled(target, *types, granularity, work.threshold())
        call(mask.ctypes.data, *mask.shape, flags.ctypes.data, pos.ctypes.data, crd.ctypes.data)
    n = int(pos[-1])
    levels = [*({} for _ in grid[:-1]), {"pos": pos, "crd": crd[:n]}]
    vals = np.ones(n, dtype=dtype)
    fmt = index_format(len(grid), target) if ordered else Format.dynamic(len(grid))
    return Tensor(grid, fmt, levels, vals, index_dtype=idt, check=False)


def index_format(order: int, target: str) -> Format:
    """The format the index built on ``target`` truly has: a CPU thread fills its row's
    segment scanning the tile columns in order, so there its last level is ordered
    compressed, and a kernel may co-iterate it with other sparse operands or visit
    every coordinate beside it; CUDA's threads claim slots in any order."""
    return Format.dynamic(order) if target == "cuda" else Format.compressed(order, order - 1)
