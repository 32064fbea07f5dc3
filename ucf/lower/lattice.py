"""Merge lattices over the operands that are sparse at one index variable.

A product intersects and a sum unions; a lattice point is the set of sparse
iterators that must all be live for its loop to run.  ``restrict`` gives the
expression that is left when only some iterators match a coordinate.

Both follow from one question, asked of every operand that may be absent: what
does the expression fold to where it is? An absent entry reads as its format's
fill value (``ucf.lang.algebra``), and a loop may skip a coordinate exactly when
the expression folds there to the loop's *target*: what skipping leaves behind
(the identity of the reduction adding the coordinate in, 0 in a dense output, the
fill value of a sparse one). With every fill 0 this is TACO's rule (an operand
whose absence absorbs a product drives it; ``+`` unions); with ``-inf`` masked
scores, ``M(i,j) + S(i,j)`` is driven by ``M`` and ``exp(M(i,j) - m(i))`` is
skipped where ``M`` is absent, since exp(-inf) is 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass, replace

from ucf.ir import nodes as ir
from ucf.lang import algebra, ast


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
    """``body`` reduced over ``vars`` by ``op`` (sum, max, min); ``id`` tells apart
    reductions that look alike."""

    vars: tuple[str, ...]
    body: Term
    id: int
    op: str = "sum"


@dataclass(frozen=True)
class Temp(Term):
    """The value of ``Reduce`` number ``id`` once a nested loop nest has computed it.

    ``n`` is negative, so a temporary can be named in ``restrict``'s zero set
    beside the operands without ever being mistaken for one. Absent (its reduction
    met no stored entry), it holds its reduction's identity."""

    id: int
    op: str = "sum"

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
            return Reduce(x.vars, go(x.body), k, x.op)
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


def shared_reads(t: Term, alias: dict[int, int]) -> Term:
    """``t`` with each operand in ``alias`` read as the one it maps to."""
    if not alias:
        return t
    if isinstance(t, Opnd):
        return Opnd(alias.get(t.n, t.n))
    if not is_dataclass(t):
        return t
    changed = {}
    for f in fields(t):
        v = getattr(t, f.name)
        if isinstance(v, Term):
            changed[f.name] = shared_reads(v, alias)
        elif isinstance(v, tuple) and any(isinstance(x, Term) for x in v):
            changed[f.name] = tuple(shared_reads(x, alias) if isinstance(x, Term) else x for x in v)
    return replace(t, **changed)


def operands(t: Term | None) -> set[int]:
    """The operand numbers a term reads, inside its sums too."""
    if isinstance(t, Opnd):
        return {t.n}
    if t is None:
        return set()
    return set().union(*(operands(c) for c in subterms(t)))


#: The fill value of each operand number (absent entries read as it); all 0 by default.
Fills = Callable[[int], float]


def zero_fills(n: int) -> float:
    return 0.0


def restrict(
    t: Term | None, zero: set[int], fill: Fills = zero_fills, target: float = 0.0
) -> Term | None:
    """The term with the operands in ``zero`` absent (read as their fill values) and
    folded; None where it folds to ``target``, what an unvisited coordinate stands for
    (the case then does nothing)."""
    if t is None:
        return None
    folded = _fold(t, zero, fill)
    if isinstance(folded, Lit) and algebra.same(float(folded.value), target):
        return None
    return folded


def folded(t: Term, zero: set[int], fill: Fills = zero_fills) -> float | None:
    """The constant ``t`` folds to with the operands in ``zero`` absent, or None where
    it still depends on another operand: the value of every coordinate a loop skips
    when its target is that constant (``ucf.lower.temporaries`` folds it into a max
    once, rather than visiting each such coordinate)."""
    return _known(_fold(t, zero, fill))


def _fold(t: Term, zero: set[int], fill: Fills) -> Term:
    if isinstance(t, Opnd):
        return Lit(fill(t.n)) if t.n in zero else t
    if isinstance(t, Temp):
        return Lit(algebra.IDENTITY[t.op]) if t.n in zero else t
    if isinstance(t, Lit):
        return t
    if isinstance(t, Negate):
        inner = _fold(t.operand, zero, fill)
        return Lit(-inner.value) if isinstance(inner, Lit) else Negate(inner)
    if isinstance(t, Reduce):
        body = _fold(t.body, zero, fill)
        value = algebra.reduced(t.op, _known(body))
        return Lit(value) if value is not None else Reduce(t.vars, body, t.id, t.op)
    if isinstance(t, Func):
        args = [_fold(a, zero, fill) for a in t.args]
        value = algebra.call(t.fn, [_known(a) for a in args])
        if value is not None:
            return Lit(value)
        if t.fn in ("max", "min"):  # the identity of max (min) leaves the other argument
            for a, b in ((args[0], args[1]), (args[1], args[0])):
                if algebra.same(_known(a), algebra.IDENTITY[t.fn]):
                    return b
        return Func(t.fn, tuple(args))
    assert isinstance(t, Op)
    left, right = _fold(t.left, zero, fill), _fold(t.right, zero, fill)
    a, b = _known(left), _known(right)
    value = algebra.binary(t.op, a, b)
    if value is not None:
        return Lit(value)
    if t.op in "+-" and algebra.same(b, 0.0):
        return left
    if t.op == "+" and algebra.same(a, 0.0):
        return right
    if t.op == "-" and algebra.same(a, 0.0):
        return Negate(right)
    return Op(t.op, left, right)


def _known(t: Term) -> float | None:
    return float(t.value) if isinstance(t, Lit) else None


@dataclass(frozen=True)
class Point:
    iters: frozenset[int]
    full: bool  # iterates every coordinate of the dimension


def lattice(
    t: Term, sparse: Callable[[int], bool], fill: Fills = zero_fills, target: float = 0.0
) -> list[Point]:
    """Points from the largest iterator set down; the first point is the top, full when
    some coordinate where every sparse operand is absent still differs from ``target``."""
    raw, background = _points(t, sparse, fill)
    if not algebra.same(background, target) or not raw:
        raw = [*raw, Point(frozenset(), True)]
    points = _merged(raw)
    full = any(p.full for p in points)
    points.sort(key=lambda p: -len(p.iters))
    points[0] = Point(points[0].iters, full)
    return points


def _points(
    t: Term, sparse: Callable[[int], bool], fill: Fills
) -> tuple[list[Point], float | None]:
    """The points where ``t`` may differ from its background, and the background: what
    it folds to where every sparse operand is absent (None: it varies there, and a
    full point says so)."""
    if isinstance(t, Opnd):
        if sparse(t.n):
            return [Point(frozenset({t.n}), False)], fill(t.n)
        return [Point(frozenset(), True)], None
    if isinstance(t, Lit):
        return [], float(t.value)
    if isinstance(t, Temp):
        return [Point(frozenset(), True)], None
    if isinstance(t, Negate):
        points, b = _points(t.operand, sparse, fill)
        return points, (None if b is None else -b)
    if isinstance(t, Reduce):
        points, b = _points(t.body, sparse, fill)
        value = algebra.reduced(t.op, b)
        return _varying(points, value), value
    if isinstance(t, Func):
        parts = [_points(a, sparse, fill) for a in t.args]
        if len(parts) == 2:
            return _binary(t.fn, *parts)
        points, b = parts[0]
        value = algebra.call(t.fn, [b])
        return _varying(points, value), value
    assert isinstance(t, Op)
    return _binary(t.op, _points(t.left, sparse, fill), _points(t.right, sparse, fill))


def _varying(points: list[Point], value: float | None) -> list[Point]:
    """``points`` plus a full point when the background is not a known constant,
    merged (``_merged``): so the products of ``_binary`` stay small; unmerged they
    multiply along the term (a gradient of nested maxes of a tensor read four times
    filled 23 GB)."""
    return _merged(points if value is not None else [*points, Point(frozenset(), True)])


def _merged(points: list[Point]) -> list[Point]:
    """Each set of iterators once, full if any of its points is, in first-seen order."""
    merged: dict[frozenset[int], bool] = {}
    for p in points:
        merged[p.iters] = merged.get(p.iters, False) or p.full
    return [Point(k, f) for k, f in merged.items()]


def _binary(op: str, left, right) -> tuple[list[Point], float | None]:
    """``left op right``: where both differ from their backgrounds (the intersection of
    their points), and where one alone does unless the other's background absorbs
    ``op`` (0 in a product drops the other side's points, -inf in a sum does too)."""
    (lp, a), (rp, b) = left, right
    value = algebra.binary(op, a, b)
    alone_left, alone_right = _alone(op, a, b, value)
    both = [Point(x.iters | y.iters, x.full and y.full) for x in lp for y in rp]
    points = both + (lp if alone_left else []) + (rp if alone_right else [])
    if op == "/":
        points = lp  # the divisor is never absent: sparse divisors are refused
    return _varying(points, value), value


def _alone(op: str, a: float | None, b: float | None, value: float | None) -> tuple[bool, bool]:
    """Whether ``left op right`` must be visited where the left side alone differs from
    its background ``a``, and where the right alone does from ``b``. Not where the
    absent side's background absorbs ``op`` into the result's background ``value``. Two
    absorbing backgrounds may disagree: in ``2*A + B`` with A ``fill=-inf`` and B
    ``fill=inf`` the background is -inf (the left decides), but where A alone is
    stored the sum is +inf, which a max must see (tests/lang/test_fuzz_fills.py)."""
    left = not (algebra.absorbing(op, b) and algebra.binary(op, None, b) == value)
    right = not (algebra.absorbing(op, a) and algebra.binary(op, a, None) == value)
    return left, right


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
        return Reduce(t.vars, substitute(t.body, k, new), t.id, t.op)
    return t


def presence(
    t: Term, flags: dict[int, ir.Expr], fill: Fills = zero_fills, target: float = 0.0
) -> ir.Expr | bool:
    """Whether a term may differ from ``target`` when the operands in ``flags`` are
    present exactly where their flag holds (every other operand is present): the merge
    lattice as a formula.  Python booleans stand for constants."""
    differs, background = _differs(t, flags, fill)
    return differs if algebra.same(background, target) else True


def _both(a, b):
    if a is False or b is False:
        return False
    return b if a is True else a if b is True else ir.land(a, b)


def _either(a, b):
    if a is True or b is True:
        return True
    return b if a is False else a if b is False else ir.lor(a, b)


def _differs(t: Term, flags, fill: Fills) -> tuple[ir.Expr | bool, float | None]:
    """Whether ``t`` may differ from its background, and the background (as
    ``_points``, over the flagged operands)."""
    if isinstance(t, Opnd):
        if t.n in flags:
            return flags[t.n], fill(t.n)
        return True, None
    if isinstance(t, Lit):
        return False, float(t.value)
    if isinstance(t, Temp):
        return True, None
    if isinstance(t, Negate):
        d, b = _differs(t.operand, flags, fill)
        return d, (None if b is None else -b)
    if isinstance(t, Reduce):
        d, b = _differs(t.body, flags, fill)
        value = algebra.reduced(t.op, b)
        return (d if value is not None else True), value
    if isinstance(t, Func):
        parts = [_differs(a, flags, fill) for a in t.args]
        if len(parts) == 2:
            return _binary_differs(t.fn, *parts)
        d, b = parts[0]
        value = algebra.call(t.fn, [b])
        return (d if value is not None else True), value
    assert isinstance(t, Op)
    return _binary_differs(t.op, _differs(t.left, flags, fill), _differs(t.right, flags, fill))


def _binary_differs(op: str, left, right) -> tuple[ir.Expr | bool, float | None]:
    (dl, a), (dr, b) = left, right
    value = algebra.binary(op, a, b)
    if value is None:
        return True, None
    if op == "/":
        return dl, value
    result = _both(dl, dr)
    alone_left, alone_right = _alone(op, a, b, value)
    if alone_left:
        result = _either(result, dl)
    if alone_right:
        result = _either(result, dr)
    return result, value


def why_full(t: Term, fill: Fills = zero_fills, target: float = 0.0) -> str:
    """Why a loop must visit every coordinate: a function that is nonzero at zero, a
    fill value the expression does not absorb, or a sum with a dense term."""
    for x in walk(t):
        if isinstance(x, Func) and len(x.args) == 1:
            value = algebra.call(x.fn, [0.0])
            if value != 0:
                return f"{x.fn} maps 0 to a nonzero value"
    if any(fill(n) for n in operands(t)):
        return f"where its operands are absent the expression is not {target}"
    return "a sum with a dense term"


def has_division(t: Term) -> bool:
    return any(isinstance(x, Op) and x.op == "/" for x in walk(t))
