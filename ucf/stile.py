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
by the LLVM JIT (``llvm``) or the C compiler (``c``).
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

import numpy as np

from ucf.errors import OperandError, UnsupportedError, boundary
from ucf.format.tensor import Tensor
from ucf.format.values import index_dtype_of
from ucf.ir import nodes as ir
from ucf.lower import parallel

TARGETS = ("llvm", "c")


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
    fn = _function(mask_type, idx, granularity, threshold)
    types = [ctypes.c_void_p if p.is_array else ctypes.c_int64 for p in fn.params]
    if target == "llvm":
        from ucf.codegen import llvm as llvmgen
        from ucf.exec import jit

        jit.openmp_runtime()
        library = jit.compile_ir(llvmgen.module([fn]))
        call = ctypes.CFUNCTYPE(None, *types)(library.address(fn.name))
        return call, library
    from ucf.codegen import c as cgen
    from ucf.exec import cache as kcache
    from ucf.exec import cc
    from ucf.exec.jit import openmp_runtime

    source = cgen.source([fn])
    openmp_runtime()
    library = kcache.library(
        {"stile_index": source, **cc.identity()}, lambda: cc.build_shared(source)
    )
    call = getattr(library, fn.name)
    call.argtypes, call.restype = types, None
    return call, library


@boundary
def stile_index(
    mask: Any,
    granularity: tuple[int, ...],
    target: str = "llvm",
    dtype: Any = np.float32,
    index_dtype: Any = "int32",
) -> Tensor:
    """The nonzero ``granularity`` micro-tiles of ``mask`` as a ``U...UQ`` Tensor.

    ``granularity`` has one tile extent per mode of the mask. The tensor's shape is
    the grid of tiles (the last tile of a mode may be partial); entry (I, ..., J) is
    stored, with value 1, when that tile of the mask holds a nonzero. The tiles of
    every mode but the last are dense levels; within one of their rows the tile
    columns come in whatever order the kernel wrote them (the last level is
    unordered: ``Q``). ``target`` is ``"llvm"`` or ``"c"``. A mask that is not
    C-contiguous is copied into one first.
    """
    a = mask_array(mask, "stile_index: the mask")
    g = check_granularity(granularity, a.ndim, "stile_index")
    return build(a, g, target, dtype, index_dtype)


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
) -> Tensor:
    """The index of a checked C-contiguous ``mask`` (see ``stile_index``): what dynamic
    kernels call on every call."""
    if target not in TARGETS:
        raise UnsupportedError(f"stile_index runs on {' or '.join(TARGETS)}, not {target!r}")
    idt = index_dtype_of(index_dtype)
    grid = tuple(-(-n // b) for n, b in zip(mask.shape, granularity, strict=True))
    rows, kb = int(np.prod(grid[:-1], dtype=np.int64)), grid[-1]
    if rows * kb > np.iinfo(idt).max:
        raise OperandError(f"stile_index: {rows * kb} tiles do not fit index dtype {idt}")
    types = ir.NUMPY_TO_IR[mask.dtype.name], ir.NUMPY_TO_IR[idt.name]
    call, _ = _compiled(target, *types, granularity, parallel.threshold())
    flags = np.zeros(rows * kb, dtype=np.int32)
    pos = np.zeros(rows + 1, dtype=idt)
    crd = np.empty(max(rows * kb, 1), dtype=idt)
    call(mask.ctypes.data, *mask.shape, flags.ctypes.data, pos.ctypes.data, crd.ctypes.data)
    n = int(pos[-1])
    levels = [*({} for _ in grid[:-1]), {"pos": pos, "crd": crd[:n]}]
    vals = np.ones(n, dtype=dtype)
    fmt = "U" * (len(grid) - 1) + "Q"
    return Tensor(grid, fmt, levels, vals, index_dtype=idt, check=False)
