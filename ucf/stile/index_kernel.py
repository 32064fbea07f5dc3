"""The index of nonzero micro-tiles built on the CPU: one LLIR function (a thread per
row of tiles marks and counts its live tiles, a prefix sum gives each row its segment,
the threads fill their segments), and compiling an LLIR function for ``llvm`` or ``c``
into a ctypes function, which the gathered compute tiles (``ucf.stile.gathered``) and
fused attention (``ucf.nn.attention_fused``) call as well.

Apart from the user's entry (``ucf.stile.tile_index``) and the CUDA builder
(``ucf.stile.tile_index_cuda``, which compares mask elements as this one does) because
it is the kernel itself: what it computes and how it is compiled, cached and called.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

from ucf.ir import nodes as ir


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
        "!=",
        ir.cast(ir.Load(mask, ir.add(row, c)), compare_type(mask_type)),
        compared_zero(mask_type),
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


def compare_type(mask_type: str) -> str:
    """The type a mask element is compared in (storage types load as a wider one)."""
    return {"f16": "f32", "i8": "i32", "u8": "i32"}.get(mask_type, mask_type)


def compared_zero(mask_type: str) -> ir.Const:
    t = compare_type(mask_type)
    return ir.Const(0.0 if t.startswith("f") else 0, t)


@cache
def compiled_index(
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
