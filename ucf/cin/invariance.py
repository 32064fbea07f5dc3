"""Permutation invariance of a statement's index variables (SparDA, section 3.1).

A variable is permutation invariant when shuffling its coordinates in every
operand (and un-shuffling the output) leaves the result unchanged: sums
commute and output elements are independent.  That is what lets the nonzero
micro-tiles along it be gathered in any order into a dense compute tile, so an
index of them can be built out of order, without sorting.  SparDA sorts the
variables into three kinds:

- ``prevalent``: in every tensor, the output included (the ``b`` of a batch matmul);
- ``sporadic``: in some tensors but not all (``m``, ``n``, ``k`` of a matmul);
- ``compound``: inside an index that is not the bare variable (``x + r`` of a
  convolution), whose arithmetic a permutation would break.

Condensing (permuting) is legal for prevalent and sporadic variables, never for
compound ones.  The permutation may differ from one coordinate of another
variable to the next (a mask tile of one row by 32 columns condenses the columns
of each row on their own) only along a variable whose computations are
independent: a prevalent one, as SparDA's rule has it, or an output variable,
since the computation is then tiled along it and every tile is condensed on its
own (SparDA section 3.2).  Along a variable that is summed, one permutation must
serve all its coordinates.
"""

from __future__ import annotations

from collections.abc import Iterable

from ucf.errors import ScheduleError, boundary
from ucf.lang.ast import Access, Statement, accesses

KINDS = ("prevalent", "sporadic", "compound")


def _tensors(stmt: Statement) -> list[Access]:
    return [stmt.lhs, *accesses(stmt.rhs)]


def classify(stmt: Statement) -> dict[str, str]:
    """Each index variable's kind, in order of first appearance (output first)."""
    every: dict[str, None] = {}
    holders: dict[str, set[str]] = {}
    compound: dict[str, None] = {}
    tensors = _tensors(stmt)
    for a in tensors:
        for idx in a.indices:
            for v in idx.variables:
                every.setdefault(v, None)
                holders.setdefault(v, set()).add(a.tensor)
                if idx.single_variable != v:
                    compound.setdefault(v, None)
    names = {a.tensor for a in tensors}
    return {
        v: "compound" if v in compound else "prevalent" if holders[v] == names else "sporadic"
        for v in every
    }


@boundary
def invariance(stmt: str | Statement) -> dict[str, str]:
    """``ucf.invariance("C(m,n) = A(m,k)*B(k,n)")``: each index variable's kind,
    ``"prevalent"``, ``"sporadic"`` or ``"compound"``."""
    return classify(_statement(stmt))


@boundary
def condensable(stmt: str | Statement, dims: Iterable[str], per: Iterable[str] = ()) -> None:
    """``ucf.condensable(stmt, ["k"], per=["b"])``: raise a ScheduleError naming the
    variable unless ``dims`` may be condensed with a permutation differing along ``per``."""
    check_condense(_statement(stmt), dims, per)


def _statement(stmt: str | Statement) -> Statement:
    if isinstance(stmt, Statement):
        return stmt
    from ucf.lang.parser import parse_statement  # lark: not on a cached kernel's path

    return parse_statement(stmt)


def compound_access(stmt: Statement, v: str) -> str:
    """The first access that holds ``v`` inside an affine index (for messages)."""
    for a in _tensors(stmt):
        if any(v in idx.variables and idx.single_variable != v for idx in a.indices):
            return str(a)
    return ""


def check_condense(stmt: Statement, dims: Iterable[str], per: Iterable[str] = ()) -> None:
    """Refuse condensing ``dims`` with a permutation that may differ along ``per``.

    Raises a ScheduleError naming the variable that makes it illegal; returns when
    the condensing keeps the statement's result.
    """
    kinds = classify(stmt)
    dims, per = list(dims), list(per)
    for v in [*dims, *per]:
        if v not in kinds:
            raise ScheduleError(
                f"condense: {v} is not an index variable of {stmt} "
                f"(its variables are {', '.join(kinds)})"
            )
    for v in dims:
        if kinds[v] == "compound":
            raise ScheduleError(
                f"condense: {v} is a compound variable (in {compound_access(stmt, v)}): "
                "permuting its coordinates would break the affine index, so it cannot be "
                "condensed"
            )
    out = {v for idx in stmt.lhs.indices for v in idx.variables}
    for p in per:
        if p in dims:
            continue
        if kinds[p] == "compound" or p not in out:
            raise ScheduleError(
                f"condense: the permutation of {', '.join(dims)} cannot differ from one "
                f"coordinate of {p} to the next: {p} is {kinds[p]} and "
                f"{'summed' if p not in out else 'inside an affine index'}, so one "
                f"permutation must serve all its coordinates"
            )


def describe(stmt: Statement) -> str:
    """The note ``k.cin`` shows: each variable and its kind."""
    kinds = classify(stmt)
    shown = ", ".join(f"{v} {k}" for v, k in kinds.items())
    return f"permutation invariance: {shown}"
