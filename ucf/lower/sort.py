"""An in-place ascending sort of int64 coordinates, as an LLIR helper function.

A precompute workspace collects the coordinates a row touches in arrival
order; a compressed output needs them sorted.  Writing the sort in LLIR gives
both backends the same code with no runtime library: insertion sort for the
short lists that are typical, heapsort (no recursion, n log n) beyond.
"""

from __future__ import annotations

from ucf.ir import nodes as ir
from ucf.ir.nodes import Array, Const, Var

NAME = "ucf_sort_i64"
_I64 = "i64"
_SMALL = 32


def _c(v: int) -> Const:
    return Const(v, _I64)


def _sift(a: Array, root: ir.Expr, end: ir.Expr, tag: str) -> list[ir.Stmt]:
    """Move a[root] down the max-heap a[0:end) to where it belongs."""
    r, x, c, go = (
        Var(f"r{tag}", _I64),
        Var(f"x{tag}", _I64),
        Var(f"c{tag}", _I64),
        Var(f"go{tag}", "i1"),
    )
    pick_right = ir.land(
        ir.Cmp("<", ir.add(c, _c(1)), end),
        ir.Cmp(">", ir.Load(a, ir.add(c, _c(1))), ir.Load(a, c)),
    )
    step = [
        ir.Assign(c, ir.add(ir.mul(r, _c(2)), _c(1))),
        ir.If(
            ir.Cmp(">=", c, end),
            [ir.Assign(go, Const(False, "i1"))],
            [
                ir.If(pick_right, [ir.Assign(c, ir.add(c, _c(1)))]),
                ir.If(
                    ir.Cmp("<=", ir.Load(a, c), x),
                    [ir.Assign(go, Const(False, "i1"))],
                    [ir.Store(a, r, ir.Load(a, c)), ir.Assign(r, c)],
                ),
            ],
        ),
    ]
    return [
        ir.Assign(r, root),
        ir.Assign(x, ir.Load(a, root)),
        ir.Assign(go, Const(True, "i1")),
        ir.While(go, step),
        ir.Store(a, r, x),
    ]


def sort_function() -> ir.Function:
    a = Array("a", _I64, True)
    n = Var("n", _I64)
    k, j, x = Var("k", _I64), Var("j", _I64), Var("x", _I64)
    insertion = [
        ir.For(
            k,
            _c(1),
            n,
            [
                ir.Decl(x, ir.Load(a, k)),
                ir.Decl(j, k),
                ir.While(
                    ir.land(ir.Cmp(">", j, _c(0)), ir.Cmp(">", ir.Load(a, ir.sub(j, _c(1))), x)),
                    [ir.Store(a, j, ir.Load(a, ir.sub(j, _c(1)))), ir.Assign(j, ir.sub(j, _c(1)))],
                ),
                ir.Store(a, j, x),
            ],
        )
    ]
    start, end, t = Var("start", _I64), Var("end", _I64), Var("t", _I64)
    decls = [
        ir.Decl(Var(f"{v}{tag}", ty), Const(init, ty))
        for tag in ("h", "s")
        for v, ty, init in (("r", _I64, 0), ("x", _I64, 0), ("c", _I64, 0), ("go", "i1", False))
    ]
    heap = [
        *decls,
        ir.Decl(start, ir.Bin("/", n, _c(2))),
        ir.While(
            ir.Cmp(">", start, _c(0)),
            [ir.Assign(start, ir.sub(start, _c(1))), *_sift(a, start, n, "h")],
        ),
        ir.Decl(end, n),
        ir.While(
            ir.Cmp(">", end, _c(1)),
            [
                ir.Assign(end, ir.sub(end, _c(1))),
                ir.Decl(t, ir.Load(a, end)),
                ir.Store(a, end, ir.Load(a, _c(0))),
                ir.Store(a, _c(0), t),
                *_sift(a, _c(0), end, "s"),
            ],
        ),
    ]
    params = [
        ir.Param("a", _I64, True, True, doc="coordinates to sort in place"),
        ir.Param("n", _I64, False, doc="how many"),
    ]
    body = [ir.If(ir.Cmp("<=", n, _c(_SMALL)), insertion, heap)]
    return ir.Function(NAME, params, body, doc="Sort a[0:n) ascending.", internal=True)
