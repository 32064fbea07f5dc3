"""Merge lattices over the operands that are sparse at one index variable.

A product intersects and a sum unions; a lattice point is the set of sparse
iterators that must all be live for its loop to run.  ``restrict`` gives the
expression that is left when only some iterators match a coordinate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ucf.lang import ast


class Term:
    """An rhs expression whose leaves are operand numbers (access occurrences)."""


@dataclass(frozen=True)
class Opnd(Term):
    n: int


@dataclass(frozen=True)
class Lit(Term):
    value: float | int


@dataclass(frozen=True)
class Negate(Term):
    operand: Term


@dataclass(frozen=True)
class Op(Term):
    op: str
    left: Term
    right: Term


def from_ast(e: ast.Expr) -> Term:
    """Number accesses left to right, so A(i)*A(i) is two operands, not one."""
    counter = iter(range(1 << 30))

    def go(x: ast.Expr) -> Term:
        if isinstance(x, ast.Access):
            return Opnd(next(counter))
        if isinstance(x, ast.Literal):
            return Lit(x.value)
        if isinstance(x, ast.Neg):
            return Negate(go(x.operand))
        assert isinstance(x, ast.Binary)
        left = go(x.left)
        return Op(x.op, left, go(x.right))

    return go(e)


def operands(t: Term | None) -> set[int]:
    if isinstance(t, Opnd):
        return {t.n}
    if isinstance(t, Negate):
        return operands(t.operand)
    if isinstance(t, Op):
        return operands(t.left) | operands(t.right)
    return set()


def restrict(t: Term | None, zero: set[int]) -> Term | None:
    """The term with operands in ``zero`` replaced by 0; None means identically zero."""
    if t is None:
        return None
    if isinstance(t, Opnd):
        return None if t.n in zero else t
    if isinstance(t, Lit):
        return None if t.value == 0 else t
    if isinstance(t, Negate):
        inner = restrict(t.operand, zero)
        return None if inner is None else Negate(inner)
    assert isinstance(t, Op)
    left, right = restrict(t.left, zero), restrict(t.right, zero)
    if t.op in "*/":
        if left is None or right is None:
            return None
        return Op(t.op, left, right)
    if left is None:
        return right if (right is None or t.op == "+") else Negate(right)
    if right is None:
        return left
    return Op(t.op, left, right)


@dataclass(frozen=True)
class Point:
    iters: frozenset[int]
    full: bool  # iterates every coordinate of the dimension


def lattice(t: Term, sparse: Callable[[int], bool]) -> list[Point]:
    """Points from the largest iterator set down; the first point is the top."""
    raw = _points(t, sparse)
    merged: dict[frozenset[int], bool] = {}
    for p in raw:
        merged[p.iters] = merged.get(p.iters, False) or p.full
    points = [Point(k, f) for k, f in merged.items()]
    points.sort(key=lambda p: -len(p.iters))
    return points


def _points(t: Term, sparse: Callable[[int], bool]) -> list[Point]:
    if isinstance(t, Opnd):
        return [Point(frozenset({t.n}), False)] if sparse(t.n) else [Point(frozenset(), True)]
    if isinstance(t, Lit):
        return [Point(frozenset(), True)]
    if isinstance(t, Negate):
        return _points(t.operand, sparse)
    assert isinstance(t, Op)
    left, right = _points(t.left, sparse), _points(t.right, sparse)
    if t.op == "/":
        return left
    if t.op == "*":
        return [Point(a.iters | b.iters, a.full and b.full) for a in left for b in right]
    both = [Point(a.iters | b.iters, a.full or b.full) for a in left for b in right]
    return both + left + right
