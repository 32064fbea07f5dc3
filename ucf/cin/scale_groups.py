"""Sums of quantized products split at their scale groups.

A product of quantized operands is summed in int32 and rescaled once, which the
lowering does for any sum whose factors' scale groups stay fixed while it runs
(``ucf.lower.held``). A reduction over a variable that a scale group depends on
(``k_blk`` for a scale per block of ``bcsr(32,32)@qint8:1``) is split in two:

    C(i,j) = sum(k_blk, k_in, A * B)
        ->   sum(k_blk, 1 * sum(k_in, A * B))

so the inner sum, over the places of one block, is a nested sum of its own: a
temporary computed in int32 where ``k_blk`` and the output's variables are fixed,
and the outer one adds it rescaled. (The ``1 *`` keeps the inner sum nested: sums
that directly follow each other are one reduction.)
"""

from __future__ import annotations

from ucf.format.format import Format
from ucf.lang.ast import Access, Binary, Expr, Literal, Neg, Statement, Sum


def group_sums(stmt: Statement, fmts: dict[str, Format]) -> Statement:
    """``stmt`` with its reduction split where a scale group changes (see above); the
    same statement when nothing is to split."""
    rhs = stmt.rhs
    if not isinstance(rhs, Sum) or rhs.op != "sum":
        return stmt
    grouped = grouped_variables(rhs.body, fmts)
    if grouped is None:
        return stmt
    outer = tuple(v for v in rhs.vars if v in grouped)
    inner = tuple(v for v in rhs.vars if v not in grouped)
    if not outer or not inner:
        return stmt
    split = Sum(outer, Binary("*", Literal(1), Sum(inner, rhs.body)))
    return Statement(stmt.lhs, stmt.op, split, stmt.text)


def grouped_variables(body: Expr, fmts: dict[str, Format]) -> set[str] | None:
    """The variables the scale groups of ``body``'s factors depend on, when ``body`` is a
    product of quantized operands (whose sum can add int32 products), else None."""
    factors = _factors(body)
    if factors is None:
        return None
    grouped: set[str] = set()
    for a in factors:
        values = fmts[a.tensor].values if a.tensor in fmts else None
        if values is None or not values.quantized:
            return None
        if values.level is not None:
            modes = fmts[a.tensor].mode_order[: values.level + 1]
            grouped |= {v for m in modes for v in a.indices[m].variables}
    return grouped


def _factors(e: Expr) -> list[Access] | None:
    """The accesses ``e`` multiplies, when it is a product of accesses (signs allowed)."""
    if isinstance(e, Access):
        return [e]
    if isinstance(e, Neg):
        return _factors(e.operand)
    if isinstance(e, Binary) and e.op == "*":
        left, right = _factors(e.left), _factors(e.right)
        return None if left is None or right is None else left + right
    return None
