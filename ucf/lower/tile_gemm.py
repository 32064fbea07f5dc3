"""Small matrix products over runtime extents with register tiles, for kernels built
outside the pipeline (the fused attention kernels, ``ucf.lower.attention_tiles``).

``gemm`` is the one micro-kernel shape they need: ``C[r, :] (+)= A(r, t) * B[t, :]``
summed over t, where A's element comes from an index function (so a transposed or
gathered A costs nothing to express) and the rows of B and C are contiguous. A tile of
``ROWS`` rows by ``VECTORS`` vectors of C stays in registers over the whole depth,
each step a broadcast of A's element and a multiply-add per vector (``ir.add_product``:
one FMA each, as everywhere in ucf), as ``ucf.lower.condensed``'s tiles do.
"""

from __future__ import annotations

from collections.abc import Callable

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var

#: Rows of a register tile, and vectors (of 32 bytes, AVX2's) per row: 8 accumulators,
#: 2 vectors of the right-hand panel and a broadcast fit 16 vector registers.
ROWS = 4
VECTORS = 2
_SIZES = {"f32": 4, "f64": 8}


def _c(v: int) -> Const:
    return Const(v, I64)


def lanes(elem: str) -> int:
    return 32 // _SIZES[elem]


Index = Callable[[ir.Expr], ir.Expr]


def gemm(
    tag: str,
    elem: str,
    m: ir.Expr,
    n: ir.Expr,
    depth: ir.Expr,
    a: tuple[ir.Array, Callable[[ir.Expr, ir.Expr], ir.Expr]],
    b: tuple[ir.Array, Index],
    c: tuple[ir.Array, Index],
    accumulate: bool,
    row_scale: Callable[[ir.Expr], ir.Expr] | None = None,
) -> list[ir.Stmt]:
    """``C[r, 0:n] (+)= sum over t < depth of A(r, t) * B[t, 0:n]`` for rows r < m, where
    ``a`` gives A's array and the index of element (r, t), ``b`` where row t of B
    starts and ``c`` where row r of C does (rows contiguous). Register tiles of ``ROWS``
    rows by ``VECTORS`` vectors hold C across the whole depth (a broadcast of A's
    element and a multiply-add per vector per t); rows past the last group of
    ``ROWS`` take one-row tiles, columns past the last whole tile a scalar loop.
    ``row_scale(r)``, if given, multiplies row r's sums before they are stored."""
    w = lanes(elem)
    width = VECTORS * w
    vec = ir.vector(elem, w)
    a_arr, a_at = a
    b_arr, b_at = b
    c_arr, c_at = c
    t, g, r1, pn, col = (Var(f"{tag}_{x}", I64) for x in ("t", "g", "r", "pn", "col"))
    panels, groups = Var(f"{tag}_panels", I64), Var(f"{tag}_groups", I64)

    def micro(rows: int, first: ir.Expr, prefix: str) -> list[ir.Stmt]:
        acc = {
            (r, x): Var(f"{tag}{prefix}_acc{r}_{x}", vec)
            for r in range(rows)
            for x in range(VECTORS)
        }
        at = {
            (r, x): ir.add(ir.add(c_at(ir.add(first, _c(r))), ir.mul(pn, _c(width))), _c(x * w))
            for r, x in acc
        }
        zero = ir.Splat(Const(0.0, elem), w)
        head = [
            ir.Decl(v, ir.VLoad(c_arr, at[k], w) if accumulate else zero) for k, v in acc.items()
        ]
        bv = [Var(f"{tag}{prefix}_b{x}", vec) for x in range(VECTORS)]
        row_b = ir.add(b_at(t), ir.mul(pn, _c(width)))
        body: list[ir.Stmt] = [
            ir.Decl(y, ir.VLoad(b_arr, ir.add(row_b, _c(x * w)), w)) for x, y in enumerate(bv)
        ]
        for r in range(rows):
            s = Var(f"{tag}{prefix}_a{r}", vec)
            body.append(ir.Decl(s, ir.Splat(ir.Load(a_arr, a_at(ir.add(first, _c(r)), t)), w)))
            for x in range(VECTORS):
                body.append(ir.Assign(acc[r, x], ir.add_product(acc[r, x], ir.Bin("*", s, bv[x]))))
        tail: list[ir.Stmt] = []
        for (r, _x), v in acc.items():
            value: ir.Expr = v
            if row_scale is not None:
                value = ir.Bin("*", v, ir.Splat(row_scale(ir.add(first, _c(r))), w))
            tail.append(ir.Store(c_arr, at[r, _x], value))
        return [ir.For(pn, _c(0), panels, [*head, ir.For(t, _c(0), depth, body), *tail])]

    total = Var(f"{tag}_sum", elem)
    c_here = ir.add(c_at(r1), col)
    start = ir.Load(c_arr, c_here) if accumulate else Const(0.0, elem)
    term = ir.Bin("*", ir.Load(a_arr, a_at(r1, t)), ir.Load(b_arr, ir.add(b_at(t), col)))
    result: ir.Expr = total if row_scale is None else ir.Bin("*", total, row_scale(r1))
    scalar = ir.For(
        r1,
        _c(0),
        m,
        [
            ir.For(
                col,
                ir.mul(panels, _c(width)),
                n,
                [
                    ir.Decl(total, start),
                    ir.For(t, _c(0), depth, [ir.Assign(total, ir.add_product(total, term))]),
                    ir.Store(c_arr, c_here, result),
                ],
            )
        ],
    )
    return [
        ir.Decl(panels, ir.Bin("/", n, _c(width))),
        ir.Decl(groups, ir.Bin("/", m, _c(ROWS))),
        ir.For(g, _c(0), groups, micro(ROWS, ir.mul(g, _c(ROWS)), "g")),
        ir.For(r1, ir.mul(groups, _c(ROWS)), m, micro(1, r1, "s")),
        scalar,
    ]
