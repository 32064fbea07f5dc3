"""An ascending sort of int64 coordinates, as an LLIR helper function.

A precompute workspace collects the coordinates a row touches in arrival
order; a compressed output needs them sorted.  Writing the sort in LLIR gives
both backends the same code with no runtime library.  Short lists get an
insertion sort.  Longer ones get an LSD radix sort: the keys are coordinates
below a known extent, so a few counting passes over digits sized to the list
replace the unpredictable branches of a comparison sort, which dominated
Gustavson SpGEMM (a heapsort took 60 % of the kernel on 100-entry rows).
"""

from __future__ import annotations

from ucf.ir import nodes as ir
from ucf.ir.nodes import Array, Const, Var

NAME = "ucf_sort_i64"
BUCKETS = 256  # the radix sort's counters: digits have at most 8 bits
_I64 = "i64"
_SMALL = 32


def _c(v: int) -> Const:
    return Const(v, _I64)


def _log2_floor(x: ir.Expr, out: Var) -> list[ir.Stmt]:
    """``out`` = the number of bits of x (x >= 0) minus one, so floor(log2 x) for x >= 1."""
    return [
        ir.Decl(out, _c(-1)),
        ir.While(
            ir.Cmp(">", ir.Bin(">>", x, ir.add(out, _c(1))), _c(0)),
            [ir.Assign(out, ir.add(out, _c(1)))],
        ),
    ]


def _radix_pass(
    src: Array, dst: Array, cnt: Array, n: Var, nb: Var, mask: Var, shift: ir.Expr, tag: str
) -> list[ir.Stmt]:
    """One stable counting pass from src to dst on the digit ``(x >> shift) & mask``, which
    takes ``nb`` values."""
    b, e, q, r, x, run, c = (Var(f"{v}{tag}", _I64) for v in ("b", "e", "q", "r", "x", "run", "c"))

    def digit(v: ir.Expr) -> ir.Expr:
        return ir.Bin("&", ir.Bin(">>", v, shift), mask)

    return [
        ir.For(b, _c(0), nb, [ir.Store(cnt, b, _c(0))]),
        ir.For(q, _c(0), n, [ir.Store(cnt, digit(ir.Load(src, q)), _c(1), accumulate=True)]),
        ir.Decl(run, _c(0)),
        ir.For(
            e,
            _c(0),
            nb,
            [
                ir.Decl(c, ir.Load(cnt, e)),
                ir.Store(cnt, e, run),
                ir.Assign(run, ir.add(run, c)),
            ],
        ),
        ir.For(
            r,
            _c(0),
            n,
            [
                ir.Decl(x, ir.Load(src, r)),
                ir.Store(dst, ir.Load(cnt, digit(x)), x),
                ir.Store(cnt, digit(x), _c(1), accumulate=True),
            ],
        ),
    ]


def _radix(a: Array, tmp: Array, cnt: Array, n: Var, limit: Var) -> list[ir.Stmt]:
    """Sort keys in [0, limit) with digits of about log2(n) bits (4..8): few passes, and
    counters no longer than the list, so short and long rows both pay about 3n per pass."""
    top, lg = Var("top", _I64), Var("lg", _I64)
    bits, passes, d, p = (Var(v, _I64) for v in ("bits", "passes", "d", "p"))
    nb, mask = Var("nb", _I64), Var("mask", _I64)
    q = Var("qc", _I64)
    return [
        *_log2_floor(ir.sub(limit, _c(1)), top),
        ir.Decl(bits, ir.add(top, _c(1))),
        *_log2_floor(n, lg),
        ir.Assign(lg, ir.Bin("min", ir.Bin("max", lg, _c(4)), _c(8))),
        ir.Decl(passes, ir.Bin("/", ir.add(bits, ir.sub(lg, _c(1))), lg)),
        ir.Decl(d, ir.Bin("/", ir.add(bits, ir.sub(passes, _c(1))), ir.Bin("max", passes, _c(1)))),
        ir.Decl(nb, ir.Bin("<<", _c(1), d)),
        ir.Decl(mask, ir.sub(nb, _c(1))),
        ir.Decl(p, _c(0)),
        ir.While(
            ir.Cmp("<", p, passes),
            [
                *_radix_pass(a, tmp, cnt, n, nb, mask, ir.mul(p, d), "u"),
                ir.Assign(p, ir.add(p, _c(1))),
                ir.If(
                    ir.Cmp("<", p, passes),
                    [
                        *_radix_pass(tmp, a, cnt, n, nb, mask, ir.mul(p, d), "v"),
                        ir.Assign(p, ir.add(p, _c(1))),
                    ],
                    [ir.For(q, _c(0), n, [ir.Store(a, q, ir.Load(tmp, q))])],
                ),
            ],
        ),
    ]


def sort_function() -> ir.Function:
    a = Array("a", _I64, True)
    tmp = Array("tmp", _I64, True)
    cnt = Array("cnt", _I64, True)
    n, limit = Var("n", _I64), Var("limit", _I64)
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
    params = [
        ir.Param("a", _I64, True, True, doc="coordinates to sort in place"),
        ir.Param("n", _I64, False, doc="how many"),
        ir.Param("tmp", _I64, True, True, doc="scratch of n or more entries"),
        ir.Param("cnt", _I64, True, True, doc=f"scratch of {BUCKETS} entries"),
        ir.Param("limit", _I64, False, doc="every key is below this"),
    ]
    body = [ir.If(ir.Cmp("<=", n, _c(_SMALL)), insertion, _radix(a, tmp, cnt, n, limit))]
    return ir.Function(NAME, params, body, doc="Sort a[0:n) ascending.", internal=True)
