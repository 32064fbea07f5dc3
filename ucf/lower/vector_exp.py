"""``exp`` of a vector of float32 values that are at most 0, as LLIR arithmetic.

A softmax raises ``e`` to ``score - max``, never above 0, once per live score: the
hottest step of the fused attention kernels after the products. libm's ``expf``
runs one lane at a time; this runs eight (AVX2's), from operations every target
prints: Cody and Waite's reduction ``x = n ln 2 + r`` with ``|r| <= ln 2 / 2``, a
degree-7 Taylor polynomial for ``e^r`` (its first omitted term is below 5e-9 of the
result), and ``2^n`` for ``-60 <= n <= 0`` as two exact int-to-float conversions of
``1 << (k + 30)`` (LLIR has no bit cast to build the exponent field directly).

Below ``x = -41`` (``e^x < 2e-18``, under float32's resolution of any sum that
holds a weight of 1) the result is flushed to 0, and ``-inf`` (a masked score) gives
0 exactly: ``keep = max(x - max(x, -41) + 1, 0)`` is 1 above the cut and 0 at or
below ``-42``.
"""

from __future__ import annotations

import math

from ucf.ir import nodes as ir
from ucf.ir.nodes import Var

LANES = 8
F32 = ir.vector("f32", LANES)
I32 = ir.vector("i32", LANES)
CUT = -41.0
LN2_HI = 0.693359375  # ln 2's leading bits: n * LN2_HI is exact for |n| < 2^11
LN2_LO = -2.12194440e-4


def _f(value: float) -> ir.Expr:
    return ir.Splat(ir.Const(value, "f32"), LANES)


def _i(value: int) -> ir.Expr:
    return ir.Splat(ir.Const(value, "i32"), LANES)


def vexp(x: ir.Expr, tag: str) -> tuple[list[ir.Stmt], ir.Expr]:
    """Declarations computing ``exp(x)`` for an ``f32x8`` ``x`` whose lanes are at most 0
    (or -inf), and the expression of the result."""
    v = {name: Var(f"{tag}_{name}", F32) for name in ("x", "xc", "keep", "nf", "r", "p")}
    n, a, b = (Var(f"{tag}_{name}", I32) for name in ("n", "a", "b"))
    log2e = 1 / math.log(2)
    poly: ir.Expr = _f(1 / math.factorial(7))
    for k in range(6, -1, -1):
        poly = ir.add_product(_f(1 / math.factorial(k)), ir.Bin("*", v["r"], poly))
    two = [ir.Cast(ir.Bin("<<", _i(1), ir.Bin("+", k, _i(30))), F32) for k in (a, b)]
    scale = ir.Bin("*", ir.Bin("*", two[0], two[1]), _f(2.0**-60))
    stmts: list[ir.Stmt] = [
        ir.Decl(v["x"], x),
        ir.Decl(v["xc"], ir.Bin("max", v["x"], _f(CUT))),
        ir.Decl(
            v["keep"], ir.Bin("max", ir.Bin("+", ir.Bin("-", v["x"], v["xc"]), _f(1.0)), _f(0.0))
        ),
        ir.Decl(n, ir.Cast(ir.Bin("-", ir.Bin("*", v["xc"], _f(log2e)), _f(0.5)), I32)),
        ir.Decl(v["nf"], ir.Cast(n, F32)),
        ir.Decl(
            v["r"],
            ir.Bin(
                "-",
                ir.Bin("-", v["xc"], ir.Bin("*", v["nf"], _f(LN2_HI))),
                ir.Bin("*", v["nf"], _f(LN2_LO)),
            ),
        ),
        ir.Decl(v["p"], poly),
        ir.Decl(a, ir.Bin("max", n, _i(-30))),
        ir.Decl(b, ir.Bin("-", n, a)),
    ]
    return stmts, ir.Bin("*", ir.Bin("*", v["p"], scale), v["keep"])
