"""Element-wise functions as LLIR expressions.

Only the libm functions (``ir.Math``) reach the code generators; the rest are
built from comparisons and selects here, once for every target.
"""

from __future__ import annotations

from ucf.errors import UnsupportedError
from ucf.ir import nodes as ir
from ucf.lang.functions import FUNCTIONS


def check(fn: str, value_type: str) -> None:
    """Refuse a floating-point function in an integer kernel, naming it."""
    if FUNCTIONS[fn].needs_float and value_type in ir.INT_TYPES:
        raise UnsupportedError(
            f"function {fn} needs a floating-point kernel; this one computes {value_type} "
            "(use dtype float32 or float64)"
        )


def apply(fn: str, args: list[ir.Expr]) -> ir.Expr:
    x = args[0]
    zero = ir.const_like(x, 0)
    one = ir.const_like(x, 1)
    if fn in ir.MATH_FUNCTIONS:
        return ir.Math(fn, x)
    if fn in ("max", "min"):
        return ir.Bin(fn, x, args[1])
    if fn == "relu":
        return ir.Bin("max", x, zero)
    if fn == "abs":
        return ir.Select(ir.Cmp("<", x, zero), ir.Neg(x), x)
    if fn == "sign":
        negative = ir.Select(ir.Cmp("<", x, zero), ir.const_like(x, -1), zero)
        return ir.Select(ir.Cmp(">", x, zero), one, negative)
    if fn == "rsqrt":
        return ir.Bin("/", one, ir.Math("sqrt", x))
    if fn == "gelu":  # x * Phi(x) = x/2 * (1 + erf(x / sqrt(2))), as torch.nn.GELU()
        scaled = ir.Bin("*", x, ir.const_like(x, 0.5**0.5))
        half = ir.Bin("*", ir.const_like(x, 0.5), x)
        return ir.Bin("*", half, ir.Bin("+", one, ir.Math("erf", scaled)))
    assert fn == "sigmoid"
    return ir.Bin("/", one, ir.Bin("+", one, ir.Math("exp", ir.Neg(x))))
