"""Merge lattices over the operands that are sparse at one index variable.

A product intersects and a sum unions; a lattice point is the set of sparse
iterators that must all be live for its loop to run.  ``restrict`` gives the
expression that is left when only some iterators match a coordinate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ucf.ir import nodes as ir
from ucf.lang import ast
from ucf.lang.functions import FUNCTIONS


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


@dataclass(frozen=True)
class Func(Term):
    """An element-wise function of ``ucf.lang.functions``."""

    fn: str
    args: tuple[Term, ...]


@dataclass(frozen=True)
class Reduce(Term):
    """``body`` summed over ``vars``; ``id`` tells apart sums that look alike."""

    vars: tuple[str, ...]
    body: Term
    id: int


@dataclass(frozen=True)
class Temp(Term):
    """The value of ``Reduce`` number ``id`` once a nested loop nest has computed it.

    ``n`` is negative, so a temporary can be named in ``restrict``'s zero set
    beside the operands without ever being mistaken for one."""

    id: int

    @property
    def n(self) -> int:
        return -1 - self.id


def from_ast(e: ast.Expr) -> Term:
    """Number accesses left to right, so A(i)*A(i) is two operands, not one, and sums in
    the order they are written."""
    counter = iter(range(1 << 30))
    sums = iter(range(1 << 30))

    def go(x: ast.Expr) -> Term:
        if isinstance(x, ast.Access):
            return Opnd(next(counter))
        if isinstance(x, ast.Literal):
            return Lit(x.value)
        if isinstance(x, ast.Neg):
            return Negate(go(x.operand))
        if isinstance(x, ast.Call):
            return Func(x.fn, tuple(go(a) for a in x.args))
        if isinstance(x, ast.Sum):
            k = next(sums)
            return Reduce(x.vars, go(x.body), k)
        assert isinstance(x, ast.Binary)
        left = go(x.left)
        return Op(x.op, left, go(x.right))

    return go(e)


def subterms(t: Term) -> tuple[Term, ...]:
    if isinstance(t, Negate):
        return (t.operand,)
    if isinstance(t, Op):
        return (t.left, t.right)
    if isinstance(t, Func):
        return t.args
    if isinstance(t, Reduce):
        return (t.body,)
    return ()


def operands(t: Term | None) -> set[int]:
    """The operand numbers a term reads, inside its sums too."""
    if isinstance(t, Opnd):
        return {t.n}
    if t is None:
        return set()
    return set().union(*(operands(c) for c in subterms(t)))


def restrict(t: Term | None, zero: set[int]) -> Term | None:
    """The term with operands in ``zero`` replaced by 0; None means identically zero."""
    if t is None:
        return None
    if isinstance(t, Opnd | Temp):
        return None if t.n in zero else t
    if isinstance(t, Lit):
        return None if t.value == 0 else t
    if isinstance(t, Negate):
        inner = restrict(t.operand, zero)
        return None if inner is None else Negate(inner)
    if isinstance(t, Reduce):
        body = restrict(t.body, zero)
        return None if body is None else Reduce(t.vars, body, t.id)
    if isinstance(t, Func):
        args = [restrict(a, zero) for a in t.args]
        if FUNCTIONS[t.fn].zero_preserving and all(a is None for a in args):
            return None
        # An absent argument reads as 0: max(A, B) where only B is stored is max(0, B).
        return Func(t.fn, tuple(Lit(0) if a is None else a for a in args))
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
    if isinstance(t, Lit | Temp):
        return [Point(frozenset(), True)]
    if isinstance(t, Negate | Reduce):
        return _points(subterms(t)[0], sparse)
    if isinstance(t, Func):
        if not FUNCTIONS[t.fn].zero_preserving:
            # Nonzero where every argument is zero: dense over the space, like ``arg + 1``.
            return _union(_points(t.args[0], sparse), [Point(frozenset(), True)])
        points = _points(t.args[0], sparse)
        for a in t.args[1:]:
            points = _union(points, _points(a, sparse))
        return points
    assert isinstance(t, Op)
    left, right = _points(t.left, sparse), _points(t.right, sparse)
    if t.op == "/":
        return left
    if t.op == "*":
        return [Point(a.iters | b.iters, a.full and b.full) for a in left for b in right]
    return _union(left, right)


def _union(left: list[Point], right: list[Point]) -> list[Point]:
    both = [Point(a.iters | b.iters, a.full or b.full) for a in left for b in right]
    return both + left + right


def walk(t: Term):
    yield t
    for c in subterms(t):
        yield from walk(c)


def reduces(t: Term) -> list[Reduce]:
    """Every nested sum of a term, outermost first."""
    return [x for x in walk(t) if isinstance(x, Reduce)]


def top_reduces(t: Term) -> list[Reduce]:
    """The nested sums of a term that are not inside another one."""
    if isinstance(t, Reduce):
        return [t]
    return [r for c in subterms(t) for r in top_reduces(c)]


def substitute(t: Term, k: int, new: Term) -> Term:
    """The term with nested sum number ``k`` replaced."""
    if isinstance(t, Reduce) and t.id == k:
        return new
    if isinstance(t, Negate):
        return Negate(substitute(t.operand, k, new))
    if isinstance(t, Op):
        return Op(t.op, substitute(t.left, k, new), substitute(t.right, k, new))
    if isinstance(t, Func):
        return Func(t.fn, tuple(substitute(a, k, new) for a in t.args))
    if isinstance(t, Reduce):
        return Reduce(t.vars, substitute(t.body, k, new), t.id)
    return t


def presence(t: Term, flags: dict[int, ir.Expr]) -> ir.Expr | bool:
    """Whether a term is structurally nonzero when the operands in ``flags`` are present
    exactly where their flag holds (every other operand is present): the merge lattice
    as a formula.  Python booleans stand for constants."""

    def both(a, b):
        if a is False or b is False:
            return False
        return b if a is True else a if b is True else ir.land(a, b)

    def either(a, b):
        if a is True or b is True:
            return True
        return b if a is False else a if b is False else ir.lor(a, b)

    if isinstance(t, Opnd):
        return flags.get(t.n, True)
    if isinstance(t, Lit):
        return t.value != 0
    if isinstance(t, Temp):
        return True
    if isinstance(t, Negate | Reduce):
        return presence(subterms(t)[0], flags)
    if isinstance(t, Func):
        if not FUNCTIONS[t.fn].zero_preserving:
            return True
        result: ir.Expr | bool = False
        for a in t.args:
            result = either(result, presence(a, flags))
        return result
    assert isinstance(t, Op)
    left = presence(t.left, flags)
    if t.op == "/":
        return left
    right = presence(t.right, flags)
    return both(left, right) if t.op == "*" else either(left, right)


def why_full(t: Term) -> str:
    """Why a loop must visit every coordinate: a function that is nonzero at zero, or a
    sum with a dense term."""
    for x in walk(t):
        if isinstance(x, Func) and not FUNCTIONS[x.fn].zero_preserving:
            return f"{x.fn} maps 0 to a nonzero value"
    return "a sum with a dense term"


def has_division(t: Term) -> bool:
    return any(isinstance(x, Op) and x.op == "/" for x in walk(t))
