"""The derivatives of the element-wise functions, written in the statement language.

``partial(fn, args, k)`` is the derivative of ``fn(args)`` with respect to its
``k``-th argument, as an expression over the same arguments, so a derived
gradient is an ordinary statement that ucf compiles like any other. The
language has no comparisons, so steps are built from ``sign``:

- ``relu'(x) = sign(relu(x))``: 1 where x > 0, else 0 (torch's choice at 0);
- ``max(a, b)`` passes ``(1 + sign(a - b)) / 2`` to ``a`` and the rest to ``b``:
  all of it to the larger operand, half each on a tie (as ``torch.maximum``);
- ``gelu'(x) = Phi(x) + x phi(x)``, through ``erf`` and ``exp``;
- ``sqrt'(x) = rsqrt(x) / 2``, which is not a division by a sparse operand.

None stands for a derivative that is zero everywhere (``sign``), so the term
that would carry it is dropped rather than multiplied by 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ucf.lang.ast import Binary, Call, Expr, Literal, Neg

_SQRT1_2 = math.sqrt(0.5)  # 1 / sqrt(2)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)  # the normal density at 0
_TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)  # erf'(0)


def mul(*parts: Expr) -> Expr:
    out = parts[0]
    for p in parts[1:]:
        out = Binary("*", out, p)
    return out


def add(a: Expr, b: Expr) -> Expr:
    return Binary("+", a, b)


def sub(a: Expr, b: Expr) -> Expr:
    return Binary("-", a, b)


def num(value: float) -> Literal:
    return Literal(value)


def call(fn: str, *args: Expr) -> Call:
    return Call(fn, args)


def _half_step(a: Expr, b: Expr, up: bool) -> Expr:
    """``(1 + sign(a - b)) / 2`` (``up``) or ``(1 - sign(a - b)) / 2``."""
    s = call("sign", sub(a, b))
    return mul(num(0.5), add(num(1), s) if up else sub(num(1), s))


def _gelu(x: Expr) -> Expr:
    phi = mul(num(0.5), add(num(1), call("erf", mul(x, num(_SQRT1_2)))))
    density = mul(num(_INV_SQRT_2PI), call("exp", Neg(mul(num(0.5), x, x))))
    return add(phi, mul(x, density))


_UNARY: dict[str, Callable[[Expr], Expr | None]] = {
    "relu": lambda x: call("sign", call("relu", x)),
    "abs": lambda x: call("sign", x),
    "sign": lambda x: None,
    "sqrt": lambda x: mul(num(0.5), call("rsqrt", x)),
    "rsqrt": lambda x: Neg(mul(num(0.5), call("rsqrt", x), call("rsqrt", x), call("rsqrt", x))),
    "sin": lambda x: call("cos", x),
    "cos": lambda x: Neg(call("sin", x)),
    "tanh": lambda x: sub(num(1), mul(call("tanh", x), call("tanh", x))),
    "exp": lambda x: call("exp", x),
    "sigmoid": lambda x: mul(call("sigmoid", x), sub(num(1), call("sigmoid", x))),
    "erf": lambda x: mul(num(_TWO_OVER_SQRT_PI), call("exp", Neg(mul(x, x)))),
    "gelu": _gelu,
}


def partial(fn: str, args: tuple[Expr, ...], k: int) -> Expr | None:
    """d fn(args) / d args[k] as an expression over ``args``; None when it is zero."""
    if fn in ("max", "min"):
        a, b = args
        return _half_step(a, b, up=(k == 0) == (fn == "max"))
    return _UNARY[fn](args[0])
