"""Rewrites of parsed statements that several features share: fresh names, accesses
mapped, affine substitution and variable renaming that respects the sums binding them.

TeSA's propagation rules (``ucf.tesa.rules``) and the derived gradients
(``ucf.autodiff``) both build new statements from a parsed one; what they do to
the tree is here once, so the two agree on what a fresh name or a solved index is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ucf.lang.affine import Affine
from ucf.lang.ast import Access, Binary, Expr, Neg, Sum, children, with_children


def fresh(stem: str, taken: set[str]) -> str:
    """``stem``, or ``stem`` with the first number that makes it a name not in ``taken``."""
    name, k = stem, 0
    while name in taken:
        k += 1
        name = f"{stem}{k}"
    return name


def plain(a: Access) -> bool:
    """Every index is a variable of its own (no affine form, no repeated variable):
    then the access covers the tensor exactly."""
    vs = [i.single_variable for i in a.indices]
    return None not in vs and len(set(vs)) == len(vs)


def linear_in(rhs: Expr, name: str) -> bool:
    """``rhs`` is linear in ``name``: one access, reached through sums, products,
    negations and numerators only, so that it distributes over a split of it. A ``max``
    or ``min`` reduction does not: the largest of a part and of the rest are not added."""
    found = [a for a in rhs._accesses if a.tensor == name]
    if len(found) != 1:
        return False

    def reaches(e: Expr) -> bool:
        if isinstance(e, Access):
            return e.tensor == name
        if isinstance(e, Sum) and e.op == "sum":
            return reaches(e.body)
        if isinstance(e, Neg):
            return reaches(e.operand)
        if isinstance(e, Binary) and e.op == "*":
            return reaches(e.left) or reaches(e.right)
        if isinstance(e, Binary) and e.op == "/":
            return reaches(e.left) and not any(a.tensor == name for a in e.right._accesses)
        return False

    return reaches(rhs)


def map_accesses(e: Expr, fn: Callable[[Access], Expr]) -> Expr:
    """``e`` with every access ``a`` replaced by ``fn(a)``."""
    if isinstance(e, Access):
        return fn(e)
    return with_children(e, [map_accesses(c, fn) for c in children(e)])


def substitute(e: Affine, solved: Mapping[str, Affine]) -> Affine:
    """``e`` with each variable of ``solved`` replaced by its affine value."""
    for v, value in solved.items():
        if v in e.variables:
            e = e.without(v) + value.scale(e.coefficient(v))
    return e


def substitute_expr(e: Expr, solved: Mapping[str, Affine]) -> Expr:
    """``e`` with the free occurrences of the variables of ``solved`` replaced in every
    index; a sum binding one of them keeps its own (it is another variable there)."""
    if not solved:
        return e
    if isinstance(e, Access):
        return Access(e.tensor, tuple(substitute(i, solved) for i in e.indices))
    if isinstance(e, Sum):
        inner = {v: a for v, a in solved.items() if v not in e.vars}
        return Sum(e.vars, substitute_expr(e.body, inner))
    return with_children(e, [substitute_expr(c, solved) for c in children(e)])


def rename(e: Expr, names: Mapping[str, str]) -> Expr:
    """``e`` with its free variables renamed by ``names`` (a sum's own variables are
    left as they are inside it)."""
    return substitute_expr(e, {v: Affine.var(n) for v, n in names.items()})


def distinct_sums(
    e: Expr, free: set[str], taken: set[str], renamed: dict[str, str] | None = None
) -> Expr:
    """``e`` with every sum's variables renamed where they are already bound by another
    sum or used freely (``free``): a statement binds each variable once, so that the
    text of a built statement parses back into the same tree. ``taken`` holds every
    name in use; the new names join it, and ``renamed`` (if given) maps each new name
    to the one it replaces."""
    bound: set[str] = set()

    def go(x: Expr) -> Expr:
        if isinstance(x, Sum):
            names = {}
            for v in x.vars:
                if v in bound or v in free:
                    names[v] = fresh(v, taken | bound | free)
                    taken.add(names[v])
                    if renamed is not None:
                        renamed[names[v]] = v
                bound.add(names.get(v, v))
            body = rename(x.body, names)
            return Sum(tuple(names.get(v, v) for v in x.vars), go(body))
        return with_children(x, [go(c) for c in children(x)])

    return go(e)


def left_associated(e: Expr) -> Expr:
    """``e`` regrouped to the left wherever the printer would drop its parentheses: it
    writes ``a * (b / c)`` as ``a * b / c`` and ``a + (b - c)`` as ``a + b - c``, which
    parse as ``(a * b) / c`` and ``(a + b) - c``. The text of a built expression then
    parses back into the same tree."""
    e = with_children(e, [left_associated(c) for c in children(e)])
    while (
        isinstance(e, Binary)
        and e.op in "*+"
        and isinstance(e.right, Binary)
        and _LEVEL[e.right.op] == _LEVEL[e.op]
    ):
        inner = e.right
        e = Binary(inner.op, left_associated(Binary(e.op, e.left, inner.left)), inner.right)
    return e


_LEVEL = {"+": 1, "-": 1, "*": 2, "/": 2}
