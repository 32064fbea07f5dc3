"""What the language computes on known numbers: reductions' identities, values that
absorb an operator, and the fold of an operator or function over constants.

The compiler needs these to decide which coordinates a loop may skip. An absent
entry of a tensor reads as its format's fill value (0 unless the format says
otherwise, ``csr fill=-inf``), and a loop may skip the coordinates where the
expression is what skipping them leaves behind: the identity of the reduction
that adds the coordinate in (0 for a sum, -inf for a max, +inf for a min), or the
output's own fill. ``ucf.lower.lattice`` asks, for each operand that may be
absent, what the expression folds to when it is.

The folding is structural, as TACO's ``0 * x = 0`` is: a value that absorbs an
operator fixes the result whatever the other operand holds, even an infinity or
NaN there. So 0 absorbs ``*`` and ``/`` (as the dividend, and as an absent
divisor), an infinity absorbs ``+`` and ``-`` (``-inf + x = -inf``), and the
binary ``max`` is absorbed by +inf, ``min`` by -inf.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

#: The reductions of the language: ``sum(j, e)``, ``max(j, e)``, ``min(j, e)``.
REDUCTIONS = ("sum", "max", "min")

#: What a reduction over no coordinate returns, and what adding a coordinate with this
#: value in leaves unchanged.
IDENTITY = {"sum": 0.0, "max": -math.inf, "min": math.inf}


def same(a: float | None, b: float | None) -> bool:
    """Whether two known constants are equal (None is unknown, never equal)."""
    return a is not None and b is not None and a == b


def _absorbs(op: str, value: float) -> bool:
    """Whether ``value`` as an operand of ``op`` fixes the result, whatever the other is."""
    if op in "*/":
        return value == 0
    if op in "+-":
        return math.isinf(value)
    if op == "max":
        return value == math.inf
    if op == "min":
        return value == -math.inf
    return False


def absorbing(op: str, value: float | None) -> bool:
    """Whether a known ``value`` on either side of ``op`` makes the other side's value
    irrelevant (a skipped coordinate of the other side changes nothing)."""
    return value is not None and _absorbs(op, value)


def _numeric(op: str, a: float, b: float) -> float:
    with np.errstate(all="ignore"):
        x, y = np.float64(a), np.float64(b)
        if op == "+":
            return float(x + y)
        if op == "-":
            return float(x - y)
        if op == "*":
            return float(x * y)
        if op == "/":
            return float(x / y)
        if op == "max":
            return float(max(x, y))
        assert op == "min"
        return float(min(x, y))


def binary(op: str, a: float | None, b: float | None) -> float | None:
    """``a op b`` for an operator or the binary ``max``/``min``, where known: an
    absorbing operand decides it alone (see the module's docstring)."""
    if a is not None and _absorbs(op, a):
        return 0.0 if op in "*/" else a
    if b is not None and _absorbs(op, b):
        if op in "*/":
            return 0.0
        return -b if op == "-" else b
    if a is None or b is None:
        return None
    return _numeric(op, a, b)


def _sigmoid(x: np.float64) -> np.float64:
    return 1 / (1 + np.exp(-x))


def _relu(x: np.float64) -> np.float64:
    return np.maximum(x, 0)


def _erf(x: np.float64) -> float:
    return math.erf(x)


def _gelu(x: np.float64) -> float:
    """The exact GELU, x * Phi(x); at -inf its limit, 0 (IEEE would make -inf * 0)."""
    return 0.0 if x == -math.inf else float(0.5 * x * (1 + math.erf(x / math.sqrt(2))))


def _rsqrt(x: np.float64) -> np.float64:
    return 1 / np.sqrt(x)


#: The unary functions on one known number (``ucf.lower.functions`` builds their code).
UNARY: dict[str, Callable] = {
    "relu": _relu,
    "abs": np.abs,
    "sign": np.sign,
    "sqrt": np.sqrt,
    "sin": np.sin,
    "tanh": np.tanh,
    "exp": np.exp,
    "cos": np.cos,
    "sigmoid": _sigmoid,
    "gelu": _gelu,
    "erf": _erf,
    "rsqrt": _rsqrt,
}


def call(fn: str, args: list[float | None]) -> float | None:
    """A function's value where its arguments are known numbers (None: unknown)."""
    if fn in ("max", "min"):
        return binary(fn, args[0], args[1])
    if args[0] is None:
        return None
    with np.errstate(all="ignore"):
        return float(UNARY[fn](np.float64(args[0])))


def reduced(op: str, body: float | None) -> float | None:
    """A reduction's value over coordinates that all hold ``body``: its identity when
    ``body`` is the identity (so also over no coordinate at all), else unknown (a sum
    of n copies depends on n, and a max of none is -inf, not ``body``)."""
    return IDENTITY[op] if same(body, IDENTITY[op]) else None


def integer_identity(op: str, bits: int) -> int:
    """A reduction's identity in a signed integer kernel of ``bits`` bits."""
    if op == "sum":
        return 0
    limit = 1 << (bits - 1)
    return -limit if op == "max" else limit - 1
