"""A statement's propagation rules, as statements over masks.

Forward, an output element is kept where some product of kept inputs reaches
it: the statement itself read in the boolean semiring (SparTA's Table 2), where
``*`` and ``/`` keep the intersection, ``+``, ``-``, ``max`` and ``min`` the
union, a function that maps 0 to 0 its operand's mask, and any other function
(``exp``: 1 at 0) or a non-zero literal everything. Evaluated over 0/1 masks
in integers, a positive count is a kept element.

Backward, an element of an input is needed where some kept output element
depends on it. For one access of the input that is the adjoint statement: the
output's mask times the other factor of every product on the path from the
root to the access (for ``Y = A X`` the demand on ``A`` is ``Y Xᵀ``). Sums,
``+``, ``-``, negation and functions pass the demand through unchanged (a
function's output depends on its argument; a product does not depend on one
factor where the other is zero).

Where a mask is known to be all kept or all pruned, its access becomes a
constant and the statement simplifies: ``Q = X Wq`` with ``X`` fully kept
needs only the column sums of ``Wq``, computed over ``Wq`` alone and
broadcast, instead of a product over every row of ``X``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping

from ucf.lang.affine import Affine
from ucf.lang.ast import (
    Access,
    Binary,
    Call,
    Expr,
    Literal,
    Neg,
    Sum,
    children,
    index_variables,
)
from ucf.lang.functions import FUNCTIONS, Function
from ucf.lang.reductions import free_variables, sums
from ucf.lang.rewrite import fresh, plain, substitute, substitute_expr


class Const(enum.Enum):
    """A mask known without evaluating it: every element kept, or none."""

    FULL = "full"
    ZERO = "zero"


MaskExpr = Expr | Const


def mask_expr(e: Expr, known: Callable[[Access], Const | None]) -> MaskExpr:
    """``e`` in the boolean semiring: an integer expression over the tensors' 0/1 masks
    that is positive exactly where ``e`` may be non-zero, or a constant mask.

    ``known(access)`` tells which accesses read a constant mask."""
    if isinstance(e, Access):
        return known(e) or e
    if isinstance(e, Literal):
        return Const.FULL if e.value else Const.ZERO
    if isinstance(e, Neg):
        return mask_expr(e.operand, known)
    if isinstance(e, Call):
        fn = FUNCTIONS[e.fn]
        if not fn.zero_preserving:
            return Const.FULL
        args = [mask_expr(a, known) for a in e.args]
        return _union(args)
    if isinstance(e, Binary):
        left, right = mask_expr(e.left, known), mask_expr(e.right, known)
        return _product([left, right]) if e.op in "*/" else _union([left, right])
    assert isinstance(e, Sum)
    body = mask_expr(e.body, known)
    if isinstance(body, Const):
        return body  # extents are positive: a sum of kept terms is kept
    used = tuple(v for v in e.vars if v in index_variables(body))
    return Sum(used, body) if used else body


def _union(parts: list[MaskExpr]) -> MaskExpr:
    return _fold("+", parts, absorbing=Const.FULL, identity=Const.ZERO)


def _product(parts: list[MaskExpr]) -> MaskExpr:
    return _fold("*", parts, absorbing=Const.ZERO, identity=Const.FULL)


def _fold(op: str, parts: list[MaskExpr], absorbing: Const, identity: Const) -> MaskExpr:
    """``parts`` joined by ``op``, with the constant masks folded away."""
    if absorbing in parts:
        return absorbing
    rest = [p for p in parts if p is not identity]
    if not rest:
        return identity
    out = rest[0]
    for p in rest[1:]:
        out = Binary(op, out, p)
    return out


def occurrences(rhs: Expr, tensor: str) -> list[tuple[Access, list[Expr]]]:
    """Each access of ``tensor`` in ``rhs`` with the cofactors on its path: the other
    operand of every ``*`` and ``/`` between the root and the access."""
    found = []

    def walk(e: Expr, factors: list[Expr]) -> None:
        if isinstance(e, Access):
            if e.tensor == tensor:
                found.append((e, factors))
            return
        if isinstance(e, Binary) and e.op in "*/":
            walk(e.left, [*factors, e.right])
            walk(e.right, [*factors, e.left])
            return
        for c in children(e):
            walk(c, factors)

    walk(rhs, [])
    return found


def adjoint(
    output: MaskExpr,
    access: Access,
    factors: list[MaskExpr],
    extents: Mapping[str, int],
    taken: set[str],
) -> tuple[tuple[str, ...], MaskExpr, dict[str, int]] | None:
    """The demand statement for ``access``: ``(lhs, rhs, ranges)``, the demand indexed
    by ``lhs`` (one variable per index of the access) being the output's mask times the
    cofactors, summed over every other variable; ``ranges`` names the vectors of ones
    (and their lengths) that ``rhs`` reads besides the tensors' masks.

    A plain access's variables index the demand. An affine access ``I(p+r, 2*q+s)``
    gets a fresh variable ``x_k`` per index ``e_k``, and a pivot of each index (a
    variable of coefficient ±1 that no other index has, ``r`` say) is solved for:
    ``r = x_k - p`` replaces it everywhere, and a ones vector of ``r``'s extent read at
    ``x_k - p`` keeps it in its range (an affine read outside a tensor is zero). The
    indices are solved in turn, each after the earlier solutions are substituted
    into it (``T(i, i+j)``: ``i = x_0``, then ``j = x_1 - x_0``). Every other summed
    variable reads a ones vector too, which gives it its extent. None when some
    index has no pivot left (a repeated index, ``T(i,i)``), a cofactor holds a sum of
    its own, or a summed variable's extent is not known (only affine indices reach
    it): then nothing is pruned through the access."""
    rhs = _product([output, *factors])
    if plain(access):
        lhs = tuple(i.single_variable for i in access.indices)
        if isinstance(rhs, Const):
            return lhs, rhs, {}
        summed = tuple(sorted(free_variables(rhs) - set(lhs)))
        return lhs, (Sum(summed, rhs) if summed else rhs), {}
    if any(sums(f) for f in factors if not isinstance(f, Const)):
        return None
    used = set(taken) | set(extents)
    lhs: list[str] = []
    solved: dict[str, Affine] = {}
    for k, index in enumerate(access.indices):
        x = fresh(f"x{k}", used)
        used.add(x)
        lhs.append(x)
        e = substitute(index, solved)
        pivot = next((v for v, c in e.terms if abs(c) == 1 and v in extents), None)
        if pivot is None:
            return None
        value = (Affine.var(x) - e.without(pivot)).scale(e.coefficient(pivot))
        solved = {v: substitute(f, {pivot: value}) for v, f in solved.items()}
        solved[pivot] = value
    ranges: dict[str, int] = {}

    def ones(v: str, index: Affine) -> Access:
        name = fresh(f"range_{v}", used)
        used.add(name)
        ranges[name] = extents[v]
        return Access(name, (index,))

    body = rhs if isinstance(rhs, Const) else substitute_expr(rhs, solved)
    bounds = [ones(v, index) for v, index in solved.items()]
    rest = set() if isinstance(body, Const) else free_variables(body)
    rest |= {v for b in bounds for v in b.indices[0].variables}
    rest -= set(lhs)
    if not rest <= set(extents):
        return None  # a summed variable whose extent only affine indices bound
    bounds += [ones(v, Affine.var(v)) for v in sorted(rest)]
    product = _product([body, *bounds])
    if isinstance(product, Const):
        return tuple(lhs), product, ranges
    return tuple(lhs), (Sum(tuple(sorted(rest)), product) if rest else product), ranges


def _keeps_width(fn: Function) -> bool:
    return fn.arity == 1 and fn.zero_preserving and not fn.needs_float


def passthrough(rhs: Expr, out_vars: tuple[str, ...]) -> tuple[str, tuple[int, ...]] | None:
    """``(X, perm)`` when the statement is ``Y = f(X)`` element by element with ``f``
    a chain of negations and zero-preserving unary functions, and ``perm`` the axes of
    ``X`` in ``Y``'s order (a transpose). Such a statement carries bit widths through
    unchanged, both ways: ``relu`` of an 8-bit value needs 8 bits (SparGen's ReLU rule).
    Functions that need floating point (``sqrt``, ``tanh``) do not: their values are
    not the integers a width counts."""
    e = rhs
    while isinstance(e, Neg) or (isinstance(e, Call) and _keeps_width(FUNCTIONS[e.fn])):
        e = children(e)[0]
    if not isinstance(e, Access) or not plain(e):
        return None
    vs = [i.single_variable for i in e.indices]
    if sorted(vs) != sorted(out_vars):
        return None
    return e.tensor, tuple(vs.index(v) for v in out_vars)
