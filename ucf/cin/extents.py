"""Extents of index variables that only affine accesses determine.

A plain index ``T(..., v, ...)`` fixes ``|v|`` to that mode's size.  A
variable that appears only inside affine indices (the output position ``p``
of ``I(2*p + r - 1)``) gets the largest extent that keeps every access in
range, where a negative constant offset ``-c`` stands for ``c`` zeros of
padding on both sides of the mode (so ``I(p + r - 1)`` with a 3-wide filter
is a "same" convolution).  This is interval analysis over the iteration box:
each index is monotone in each variable, so its range is reached at the
box's corners.

The same rule runs on numbers (each call) and on sympy symbols (the formula
``k.cin`` shows), so what is explained is what is computed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ucf.errors import ShapeError
from ucf.lang.affine import Affine
from ucf.lang.ast import Statement, accesses


def _floordiv(a: Any, d: int) -> Any:
    if isinstance(a, int):
        return a // d
    import sympy  # symbols come from ``describe`` alone: a call's extents are numbers

    return sympy.floor(a / d)


def from_access(idx: Affine, v: str, size: Any, known: Mapping[str, Any]) -> Any:
    """The extent of ``v`` that keeps ``idx`` within a mode of ``size`` (plus padding)."""
    c = idx.coefficient(v)
    low, high = (b.evaluate(known) for b in idx.without(v).interval(lambda u: u))
    pad = max(0, -idx.const)
    if c > 0:
        return _floordiv(size - 1 + pad - high, c) + 1
    return _floordiv(low + pad, -c) + 1


def infer(
    stmt: Statement, known: dict[str, Any], size: Mapping[tuple[str, int], Any]
) -> dict[str, tuple[Any, str]]:
    """Extents, and where each came from, for the variables ``known`` lacks.

    ``size[(tensor, mode)]`` is an operand mode's size.  A variable bounded by
    several accesses takes the smallest extent, the one every access allows.
    Raises ShapeError for a negative extent; variables no access determines
    are left out.
    """
    known = dict(known)
    found: dict[str, tuple[Any, str]] = {}
    rhs = accesses(stmt.rhs)
    while True:
        candidates: dict[str, list[tuple[Any, str]]] = {}
        for a in rhs:
            for m, idx in enumerate(a.indices):
                free = [v for v in idx.variables if v not in known]
                if idx.single_variable is not None or len(free) != 1:
                    continue
                v = free[0]
                n = from_access(idx, v, size[(a.tensor, m)], known)
                where = f"{a}, mode {m} of {a.tensor}"
                if isinstance(n, int) and n < 0:
                    raise ShapeError(
                        f"index variable {v}: its extent inferred from {where} (size "
                        f"{size[(a.tensor, m)]}) is {n}; the access cannot fit, so pad the "
                        "operand or pass shapes="
                    )
                candidates.setdefault(v, []).append((n, where))
        if not candidates:
            return found
        for v, options in candidates.items():
            values = [x for x, _ in options]
            if all(isinstance(x, int) for x in values):
                n = min(values)
            else:
                import sympy

                n = sympy.Min(*values)
                if isinstance(n, sympy.Integer):
                    n = int(n)
            found[v] = (n, "; ".join(w for _, w in options))
            known[v] = n


def describe(stmt: Statement, fixed: Mapping[str, int] | None = None) -> list[str]:
    """Formulas for the extents inferred when no output or shapes= is given (``fixed``:
    the extents known when compiling)."""
    if all(i.single_variable is not None for a in accesses(stmt.rhs) for i in a.indices):
        return []  # nothing to infer: spare a compile sympy's import (most of a second)
    import sympy

    known: dict[str, Any] = dict(fixed or {})
    size: dict[tuple[str, int], Any] = {}
    for a in accesses(stmt.rhs):
        for m, idx in enumerate(a.indices):
            sym = sympy.Symbol(f"{a.tensor}.shape[{m}]", integer=True, positive=True)
            size[(a.tensor, m)] = sym
            if idx.single_variable is not None:
                known.setdefault(idx.single_variable, sym)
    return [
        f"|{v}| = {sympy.simplify(n)} (inferred from {who})"
        for v, (n, who) in infer(stmt, known, size).items()
    ]
