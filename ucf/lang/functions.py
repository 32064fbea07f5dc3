"""The element-wise functions of the statement language, and what each does to zero.

Whether a function maps 0 to 0 decides sparsity: ``relu(A(i,j))`` is zero
wherever ``A`` is, so it iterates ``A``'s nonzeros; ``exp(A(i,j))`` is 1 there,
so its result is dense over the iteration space and the loops must visit
every coordinate.  The binary ``max``/``min`` are zero where both operands are,
so they merge like ``+`` (a union), but an absent operand reads as 0 rather
than disappearing: ``max(A, B)`` where only ``B`` is stored is ``max(0, B)``.

``gelu`` (BERT's feed-forward activation, ``x * Phi(x)`` with the exact normal
distribution function, as ``torch.nn.GELU()``) and ``erf`` map 0 to 0; ``rsqrt``
(``1 / sqrt(x)``) does not. ``erf`` and ``rsqrt`` are also what the derivatives
of ``gelu`` and ``sqrt`` are written in (``ucf.autodiff``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Function:
    name: str
    arity: int
    zero_preserving: bool  # f(0, ..., 0) == 0
    needs_float: bool  # no integer kernel computes it


FUNCTIONS: dict[str, Function] = {
    f.name: f
    for f in (
        Function("relu", 1, True, False),
        Function("abs", 1, True, False),
        Function("sign", 1, True, False),
        Function("sqrt", 1, True, True),
        Function("sin", 1, True, True),
        Function("tanh", 1, True, True),
        Function("exp", 1, False, True),
        Function("cos", 1, False, True),
        Function("sigmoid", 1, False, True),
        Function("gelu", 1, True, True),
        Function("erf", 1, True, True),
        Function("rsqrt", 1, False, True),
        Function("max", 2, True, False),
        Function("min", 2, True, False),
    )
}

#: The explicit reduction ``sum(j, expr)`` / ``sum(j, k, expr)``.
SUM = "sum"

#: ``max(j, expr)`` and ``min(j, expr)`` reduce over ``j`` when ``j`` is an index
#: variable of the statement; with any other first argument they are the element-wise
#: functions above (``ucf.lang.parser`` tells them apart once the statement is read).
EXTREMA = ("max", "min")

#: Names a tensor may not take: a call of one of them is never an access.
RESERVED = frozenset(FUNCTIONS) | {SUM}
