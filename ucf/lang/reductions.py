"""Reduction notation: which part of the right-hand side each reduction variable sums.

A variable that appears on the right-hand side but not on the left is summed
over the smallest additive term that holds all of its occurrences, where an
additive term is the whole right-hand side or either operand of a ``+`` or
``-`` at any depth.  Within that term the sum covers everything: products,
quotients and function applications.  This is TACO's meaning wherever TACO
gives one: ``y(i) = A(i,j)*x(j) + b(i)`` is ``A @ x + b``, not
``A @ x + |j| * b``, while ``(B(i,j) + c(i)) * x(j)`` sums the whole product.

``sum(j, expr)`` states a reduction explicitly, as ``max(j, expr)`` and
``min(j, expr)`` state the other two; their variables must not appear outside
them.  The result binds every reduction variable by exactly one ``Sum`` node
(whose ``op`` says which reduction), so later stages never guess.
"""

from __future__ import annotations

from collections.abc import Callable

from ucf.lang.ast import (
    Access,
    Binary,
    Expr,
    Literal,
    Statement,
    Sum,
    children,
    index_variables,
    with_children,
)

Path = tuple[int, ...]


def with_reductions(
    stmt: Statement, where: Callable[[Expr], object], error: type[Exception]
) -> Expr:
    """The right-hand side with a ``Sum`` node for every implied reduction.

    ``where(node)`` gives the source position of a node for ``error(message,
    position)``, which is raised for a misused explicit ``sum``.
    """
    out = {v for idx in stmt.lhs.indices for v in idx.variables}
    bound = _check_explicit(stmt.rhs, out, where, error)
    uses: dict[str, list[Path]] = {}
    for path, node in _walk(stmt.rhs):
        if isinstance(node, Access):
            for idx in node.indices:
                for v in idx.variables:
                    if v not in out and v not in bound:
                        uses.setdefault(v, []).append(path)
    additive = {path for path, _ in _walk(stmt.rhs) if _is_additive(stmt.rhs, path)}
    at: dict[Path, list[str]] = {}
    for v, paths in uses.items():
        term = _common_prefix(paths)
        while term not in additive:
            term = term[:-1]
        at.setdefault(term, []).append(v)
    return _insert(stmt.rhs, (), at)


def _walk(e: Expr, path: Path = ()):
    yield path, e
    for k, c in enumerate(children(e)):
        yield from _walk(c, (*path, k))


def _node(e: Expr, path: Path) -> Expr:
    for k in path:
        e = children(e)[k]
    return e


def _is_additive(rhs: Expr, path: Path) -> bool:
    if not path:
        return True
    parent = _node(rhs, path[:-1])
    return isinstance(parent, Binary) and parent.op in "+-"


def _common_prefix(paths: list[Path]) -> Path:
    first = paths[0]
    n = len(first)
    for p in paths[1:]:
        n = min(n, len(p))
        n = next((k for k in range(n) if p[k] != first[k]), n)
    return first[:n]


def _insert(e: Expr, path: Path, at: dict[Path, list[str]]) -> Expr:
    e = with_children(e, [_insert(c, (*path, k), at) for k, c in enumerate(children(e))])
    if path in at:
        return Sum(tuple(at[path]), e)
    return e


#: How messages say what each reduction does, and has done, over a variable.
_WORDS = {
    "sum": ("sums", "summed"),
    "max": ("takes the largest value", "reduced"),
    "min": ("takes the smallest value", "reduced"),
}


def _check_explicit(rhs: Expr, out: set[str], where, error) -> set[str]:
    """The variables explicit reductions bind, after checking each is used only inside
    its reduction."""
    bound: set[str] = set()
    explicit = [node for _, node in _walk(rhs) if isinstance(node, Sum)]
    for path, node in _walk(rhs):
        if not isinstance(node, Sum):
            continue
        inside = set(index_variables(node.body))
        op = node.op
        verb, done = _WORDS[op]
        for v in node.vars:
            if v in out:
                raise error(
                    f"{op}({v}, ...) {verb} over {v}, which is an index of the output; "
                    f"an output variable cannot be {done}",
                    where(node),
                )
            if sum(v in other.vars for other in explicit) > 1:
                raise error(
                    f"index variable {v} is {done} by two reductions; give each its own variable",
                    where(node),
                )
            if v not in inside:
                raise error(
                    f"{op}({v}, ...): the expression it reduces does not use {v}", where(node)
                )
            outside = set(index_variables(_without(rhs, path)))
            if v in outside:
                raise error(
                    f"{op}({v}, ...): {v} is also used outside the {op}; rename one of them",
                    where(node),
                )
            bound.add(v)
    return bound


def _without(rhs: Expr, path: Path) -> Expr:
    """The expression with the node at ``path`` replaced by a literal."""
    if not path:
        return Literal(0)
    k, rest = path[0], path[1:]
    kids = children(rhs)
    return with_children(rhs, [_without(c, rest) if m == k else c for m, c in enumerate(kids)])


def peel(rhs: Expr) -> tuple[tuple[str, ...], Expr]:
    """The variables the whole right-hand side is summed over, and what is summed.

    These are the kernel's outer reduction: its loops accumulate straight into
    the output (or one scalar per output entry); every other reduction (a ``max``
    or ``min`` at the top too) is nested and computed into a temporary where its
    value is needed."""
    summed: tuple[str, ...] = ()
    while isinstance(rhs, Sum) and rhs.op == "sum":
        summed += rhs.vars
        rhs = rhs.body
    return summed, rhs


def sums(e: Expr) -> list[Sum]:
    """Every ``Sum`` node of an expression, outermost first."""
    return [node for _, node in _walk(e) if isinstance(node, Sum)]


def free_variables(e: Expr) -> set[str]:
    """The index variables ``e`` reads that no sum inside ``e`` binds: for a sum, the
    variables that must be fixed before its value can be computed."""
    return set(index_variables(e)) - {v for s in sums(e) for v in s.vars}


def temporary(variables: tuple[str, ...], op: str = "sum") -> str:
    """The name of the temporary that holds a nested reduction over ``variables`` (each
    variable is reduced by one reduction, so the name is unique in a statement)."""
    return f"{op}_" + "_".join(variables)
