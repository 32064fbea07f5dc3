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


def _function(mask_type: str, idx: str, bh: int, bw: int, threshold: int = 0) -> ir.Function:
    """``stile_index(mask, M, K, flags, pos, crd)``: ``flags`` (zeroed, one per tile)
    marks live tiles, ``pos`` (zeroed, one more than the rows of tiles) gets the
    segment bounds and ``crd`` (at least one slot per live tile) the tile columns.
    Threads start only for masks of at least ``threshold`` elements (waking them
    costs more than a small mask's scan)."""
    i64 = ir.I64
    mask = ir.Array("mask", mask_type)
    flags = ir.Array("flags", "i32", output=True)
    pos = ir.Array("pos", idx, output=True)
    crd = ir.Array("crd", idx, output=True)
    m, k = ir.Var("M", i64), ir.Var("K", i64)
    rows, cols = ir.Var("I", i64), ir.Var("J", i64)
    r, c, q, n = (ir.Var(x, i64) for x in ("r", "c", "q", "n"))
    one = ir.Const(1, i64)

    def ceil_div(a: ir.Expr, b: int) -> ir.Expr:
        return ir.Bin("/", ir.add(a, ir.Const(b - 1, i64)), ir.Const(b, i64))

    mb, kb = ceil_div(m, bh), ceil_div(k, bw)
    kbv = ir.Var("Kb", i64)
    row = ir.Var("row", i64)
    base = ir.mul(rows, kbv)
    flag_at = ir.add(base, ir.Bin("/", c, ir.Const(bw, i64)))
    live = ir.Cmp(
        "!=", ir.cast(ir.Load(mask, ir.add(row, c)), _compute(mask_type)), _zero(mask_type)
    )
    mark = ir.For(
        r,
        ir.mul(rows, ir.Const(bh, i64)),
        ir.minimum(ir.mul(ir.add(rows, one), ir.Const(bh, i64)), m),
        [
            ir.Decl(row, ir.mul(r, k)),
            ir.For(
                c,
                ir.Const(0, i64),
                k,
                [
                    ir.Store(
                        flags,
                        flag_at,
                        ir.Bin("max", ir.Load(flags, flag_at), ir.Cast(live, "i32")),
                    )
                ],
            ),
        ],
    )
    at = ir.add(base, cols)
    count = [
        ir.Decl(n, ir.Const(0, i64)),
        ir.For(
            cols, ir.Const(0, i64), kbv, [ir.Assign(n, ir.add(n, ir.cast(ir.Load(flags, at), i64)))]
        ),
        ir.Store(pos, ir.add(rows, one), ir.cast(n, idx)),
    ]
    prefix = ir.For(
        rows,
        ir.Const(0, i64),
        mb,
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
            ir.Const(0, i64),
            kbv,
            [
                ir.If(
                    ir.Cmp("!=", ir.Load(flags, at), ir.Const(0, "i32")),
                    [ir.Store(crd, q, ir.cast(cols, idx)), ir.Assign(q, ir.add(q, one))],
                )
            ],
        ),
    ]

    def per_row(body: list[ir.Stmt]) -> ir.For:
        return ir.For(
            rows,
            ir.Const(0, i64),
            mb,
            body,
            parallel="CPUThread",
            strategy="NoRaces",
            parallel_if=ir.Cmp(">=", ir.mul(m, k), ir.Const(threshold, i64)),
        )

    params = [
        ir.Param("mask", mask_type, True, doc="the mask, row-major M x K"),
        ir.Param("M", i64, False),
        ir.Param("K", i64, False),
        ir.Param("flags", "i32", True, output=True, doc="zeroed, one per tile"),
        ir.Param("pos", idx, True, output=True, doc="zeroed, rows of tiles + 1"),
        ir.Param("crd", idx, True, output=True, doc="one slot per tile at least"),
    ]
    body = [
        ir.Decl(kbv, kb),
        per_row([mark, *count]),
        prefix,
        per_row(fill),
    ]
    doc = f"the index of the nonzero {bh}x{bw} tiles of a mask"
    return ir.Function(f"ucf_stile_index_{bh}x{bw}", params, body, doc=doc)


def _compute(mask_type: str) -> str:
    """The type a mask element is compared in (storage types load as a wider one)."""
    return {"f16": "f32", "i8": "i32", "u8": "i32"}.get(mask_type, mask_type)


def _zero(mask_type: str) -> ir.Const:
    t = _compute(mask_type)
    return ir.Const(0.0 if t.startswith("f") else 0, t)


@cache
def _compiled(target: str, mask_type: str, idx: str, bh: int, bw: int, threshold: int) -> Any:
    """The index kernel as a ctypes function, built once per process and shape of tile."""
    fn = _function(mask_type, idx, bh, bw, threshold)
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
    granularity: tuple[int, int],
    target: str = "llvm",
    dtype: Any = np.float32,
    index_dtype: Any = "int32",
) -> Tensor:
    """The nonzero ``granularity`` micro-tiles of a 2-D ``mask`` as a ``UQ`` Tensor.

    The tensor's shape is the grid of tiles (the last row and column of tiles may
    be partial); entry (I, J) is stored, with value 1, when tile (I, J) of the mask
    holds a nonzero. Within a row of tiles the columns come in whatever order the
    kernel wrote them (the level is unordered: ``Q``). ``target`` is ``"llvm"`` or
    ``"c"``. A mask that is not C-contiguous is copied into one first.
    """
    if target not in TARGETS:
        raise UnsupportedError(f"stile_index runs on {' or '.join(TARGETS)}, not {target!r}")
    a = np.asarray(mask)
    if a.ndim != 2:
        raise OperandError(f"stile_index: the mask must be 2-D, got shape {a.shape}")
    if a.dtype == np.bool_:
        a = a.view(np.uint8)
    if a.dtype.name not in ir.NUMPY_TO_IR:
        raise OperandError(f"stile_index: a mask of dtype {a.dtype} is not supported")
    g = tuple(granularity) if isinstance(granularity, tuple | list) else ()
    if len(g) != 2 or not all(isinstance(x, int | np.integer) and x >= 1 for x in g):
        raise OperandError(
            f"stile_index: the granularity must be two positive integers (rows, columns) "
            f"of a tile, got {granularity!r}"
        )
    bh, bw = int(g[0]), int(g[1])
    a = np.ascontiguousarray(a)
    idt = index_dtype_of(index_dtype)
    m, k = a.shape
    mb, kb = -(-m // bh), -(-k // bw)
    if mb * kb > np.iinfo(idt).max:
        raise OperandError(f"stile_index: {mb * kb} tiles do not fit index dtype {idt}")
    types = ir.NUMPY_TO_IR[a.dtype.name], ir.NUMPY_TO_IR[idt.name]
    call, _ = _compiled(target, *types, bh, bw, parallel.threshold())
    flags = np.zeros(mb * kb, dtype=np.int32)
    pos = np.zeros(mb + 1, dtype=idt)
    crd = np.empty(max(mb * kb, 1), dtype=idt)
    call(a.ctypes.data, m, k, flags.ctypes.data, pos.ctypes.data, crd.ctypes.data)
    n = int(pos[-1])
    levels = [{}, {"pos": pos, "crd": crd[:n]}]
    vals = np.ones(n, dtype=dtype)
    return Tensor((mb, kb), "UQ", levels, vals, index_dtype=idt, check=False)
