"""The gradient of one operand of a statement, derived as a statement of its own.

For ``Y(o) = rhs`` and an operand ``X``, the gradient of a loss with respect to
``X`` is ``dL/dX[x] = sum over o of dL/dY[o] * dY[o]/dX[x]``. Each access of
``X`` in ``rhs`` contributes one term, found on the path from the root to the
access by the rules of differentiation:

- ``+`` passes the gradient to both sides and ``-`` negates it on the right;
- ``*`` multiplies it by the other factor (the product rule, one factor at a
  time), ``/`` by ``1 / right`` on the left and ``-left / right^2`` on the right;
- a function multiplies it by its derivative at its arguments (``ucf.autodiff.derivatives``);
- a sum lets its variables free: the term sums over them again, beside the
  output's variables (each term has its own sum: per-term reductions).

The term's variables are then put in terms of the gradient's own index
variables: a plain access ``X(i,j)`` is indexed by ``i`` and ``j``; an affine
access ``I(n, c, p+r, q+s)`` gets a new variable per affine index, and one
variable of coefficient ±1 of each index is solved for (``p = x2 - r``), so the
gradient of a convolution's input is again a convolution,
``grad_I(n,c,x2,x3) = sum(m, r, s, grad_O(n,m,x2-r,x3-s) * F(m,c,r,s))``. A
solved variable keeps its range through the accesses that read it (an affine
read outside a tensor is zero); one that no other access reads gets a vector of
ones of its extent, read at its value (``range_p``).

When the gradient keeps the operand's pattern (a sparse, blocked, N:M or
dynamic operand), every term is multiplied by the pattern: a tensor of ones at
the operand's stored positions, in its format. The product is an intersection,
so the kernel computes the gradient at those positions only (an SDDMM for a
matrix product), never the dense product.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ucf.autodiff.derivatives import partial
from ucf.autodiff.hoist import Hoister, Temporary
from ucf.errors import OperandError, UnsupportedError
from ucf.lang.affine import Affine
from ucf.lang.ast import (
    Access,
    Binary,
    Call,
    Expr,
    Literal,
    Neg,
    Statement,
    Sum,
    accesses,
)
from ucf.lang.reductions import free_variables, sums
from ucf.lang.rewrite import (
    distinct_sums,
    fresh,
    left_associated,
    rename,
    substitute,
    substitute_expr,
)


@dataclass(frozen=True)
class Derived:
    """The gradient of ``wrt``: ``statement`` computes it (None: it is zero everywhere)."""

    wrt: str
    statement: Statement | None
    grad: str  # the output's gradient, an operand of the statement
    pattern: str | None  # ones at wrt's stored positions, an operand when the pattern is kept
    lhs: tuple[str, ...]  # the gradient's index variables, one per mode of wrt
    #: Vectors of ones the statement reads, and the forward variable whose extent each has.
    ranges: tuple[tuple[str, str], ...] = ()
    #: The statement's variables whose extents no plain index of its operands fixes, each
    #: with where its extent comes from: a forward variable's name, or a mode of ``wrt``.
    extents: tuple[tuple[str, str | int], ...] = ()
    #: Sums the statement reads, hoisted into dense temporaries computed before it, each
    #: with where the extent of each of its variables comes from (as in ``extents``).
    prelude: tuple[tuple[Temporary, tuple[str | int, ...]], ...] = ()


@dataclass
class _Path:
    """One access of the operand and what the root-to-access path multiplies it by."""

    access: Access
    negative: bool = False
    factors: list[Expr] = field(default_factory=list)
    divisors: list[Expr] = field(default_factory=list)
    freed: list[str] = field(default_factory=list)


def derive(stmt: Statement, wrt: str, keep_pattern: bool = False) -> Derived:
    """The gradient of ``stmt``'s operand ``wrt`` as a statement reading the output's
    gradient ``grad_<output>`` (and, with ``keep_pattern``, ``pattern_<wrt>``)."""
    out = stmt.lhs
    out_vars = [i.single_variable for i in out.indices]
    if None in out_vars or len(set(out_vars)) != len(out_vars):
        raise UnsupportedError(
            f"the gradient of {stmt} needs an output indexed by distinct variables; {out} is not"
        )
    names = {a.tensor for a in (out, *accesses(stmt.rhs))}
    if wrt == out.tensor:
        raise UnsupportedError(f"{wrt} is the output of {stmt}; gradients are of its operands")
    if wrt not in names:
        raise OperandError(
            f"{wrt} is not an operand of {stmt} (operands: "
            f"{', '.join(sorted(names - {out.tensor}))})"
        )
    variables = {v for a in accesses(stmt.rhs) for i in a.indices for v in i.variables}
    variables |= set(out_vars) | {v for s in sums(stmt.rhs) for v in s.vars}
    taken = names | variables
    grad = _claim(f"grad_{out.tensor}", taken)
    pattern = _claim(f"pattern_{wrt}", taken) if keep_pattern else None
    paths = _paths(stmt.rhs, wrt)
    if not paths:  # every path holds a zero derivative (sign's)
        return Derived(wrt, None, grad, pattern, ())
    lhs = _lhs(paths[0].access, taken)
    origin: dict[str, str] = {}  # a renamed variable's forward name, whose extent it has
    ranges: list[tuple[str, str]] = []
    hoist = Hoister(taken)
    terms = [
        _term(p, lhs, Access(grad, out.indices), pattern, taken, origin, ranges, hoist)
        for p in paths
    ]
    statement = None
    if terms:
        rhs = terms[0]
        for t in terms[1:]:
            rhs = Binary("+", rhs, t)
        rhs = distinct_sums(left_associated(rhs), set(lhs), taken, origin)
        name = _claim(f"grad_{wrt}", taken)
        statement = Statement(Access(name, tuple(Affine.var(v) for v in lhs)), "=", rhs)
    prelude = tuple(
        (t, tuple(_source(v, lhs, origin) for v in t.variables)) for t in hoist.temporaries
    )
    found = Derived(wrt, statement, grad, pattern, lhs, tuple(ranges), prelude=prelude)
    return _with_extents(found, origin)


def _claim(stem: str, taken: set[str]) -> str:
    name = fresh(stem, taken)
    taken.add(name)
    return name


def _lhs(first: Access, taken: set[str]) -> tuple[str, ...]:
    """The gradient's index variables: the first access's own where it is indexed by a
    variable not seen before, else a new ``x<mode>``."""
    lhs: list[str] = []
    for k, idx in enumerate(first.indices):
        v = idx.single_variable
        lhs.append(v if v is not None and v not in lhs else _claim(f"x{k}", taken))
    return tuple(lhs)


def _paths(rhs: Expr, wrt: str) -> list[_Path]:
    found: list[_Path] = []

    def walk(e: Expr, p: _Path) -> None:
        if isinstance(e, Access):
            if e.tensor == wrt:
                found.append(_Path(e, p.negative, p.factors, p.divisors, p.freed))
        elif isinstance(e, Neg):
            walk(e.operand, _step(p, negate=True))
        elif isinstance(e, Sum):
            walk(e.body, _step(p, freed=list(e.vars)))
        elif isinstance(e, Binary):
            left, right = e.left, e.right
            if e.op == "+":
                walk(left, p)
                walk(right, p)
            elif e.op == "-":
                walk(left, p)
                walk(right, _step(p, negate=True))
            elif e.op == "*":
                walk(left, _step(p, factors=[right]))
                walk(right, _step(p, factors=[left]))
            else:  # d(l/r)/dl = 1/r, d(l/r)/dr = -l/r^2
                walk(left, _step(p, divisors=[right]))
                walk(right, _step(p, negate=True, factors=[left], divisors=[right, right]))
        elif isinstance(e, Call):
            for k, arg in enumerate(e.args):
                d = partial(e.fn, e.args, k)
                if d is not None:
                    walk(arg, _step(p, factors=[d]))
        else:
            assert isinstance(e, Literal)

    walk(rhs, _Path(Access(wrt, ())))
    return found


def _step(
    p: _Path,
    negate: bool = False,
    factors: list[Expr] = (),
    divisors: list[Expr] = (),
    freed: list[str] = (),
) -> _Path:
    return _Path(
        p.access,
        p.negative != negate,
        [*p.factors, *factors],
        [*p.divisors, *divisors],
        [*p.freed, *freed],
    )


def _term(
    path: _Path,
    lhs: tuple[str, ...],
    grad: Access,
    pattern: str | None,
    taken: set[str],
    origin: dict[str, str],
    ranges: list[tuple[str, str]],
    hoist: Hoister,
) -> Expr:
    """One access's contribution: the gradient times the path's factors, in terms of
    ``lhs`` (solving affine indices), summed over its other variables."""
    parts: list[Expr] = [grad, *path.factors]
    body = parts[0]
    for f in parts[1:]:
        body = Binary("*", body, f)
    if path.divisors:
        divisor = path.divisors[0]
        for d in path.divisors[1:]:
            divisor = Binary("*", divisor, d)
        body = Binary("/", body, divisor)
    access = path.access
    names: dict[str, str] = {}
    solved: dict[str, Affine] = {}
    if any(idx != Affine.var(v) for idx, v in zip(access.indices, lhs, strict=True)):
        # Name the term's variables apart from the gradient's before equating them.
        for v in sorted(set(lhs) & (free_variables(body) | set(_index_vars(access)))):
            names[v] = _claim(v, taken)
            origin[names[v]] = v
        body = rename(body, names)
        access = rename(access, names)
        for idx, v in zip(access.indices, lhs, strict=True):
            e = substitute(idx, solved)
            if e == Affine.var(v):
                continue
            pivot = _pivot(e, lhs, solved, body, path.access)
            value = (Affine.var(v) - e.without(pivot)).scale(e.coefficient(pivot))
            solved = {u: substitute(a, {pivot: value}) for u, a in solved.items()}
            solved[pivot] = value
            if not _kept_in_range(pivot, body):
                name = _claim(f"range_{_forward(pivot, origin)}", taken)
                ranges.append((name, _forward(pivot, origin)))
                body = Binary("*", body, Access(name, (Affine.var(pivot),)))
        body = substitute_expr(body, solved)
    body = hoist(body)
    # A variable the path sums that the term no longer reads is still summed: a vector of
    # ones of its extent counts it (b in sum(j, A(i,j) + b(i)) is added |j| times).
    own = {v for i in grad.indices for v in i.variables} | set(path.freed)
    summed_vars = {names.get(v, v) for v in own} - set(solved) - set(lhs)
    for v in sorted(summed_vars - free_variables(body)):
        name = _claim(f"range_{_forward(v, origin)}", taken)
        ranges.append((name, _forward(v, origin)))
        body = Binary("*", body, Access(name, (Affine.var(v),)))
    if pattern is not None:
        body = Binary("*", Access(pattern, tuple(Affine.var(v) for v in lhs)), body)
    summed = tuple(v for v in _ordered_free(body) if v not in lhs)
    if summed:
        body = Sum(summed, body)
    return Neg(body) if path.negative else body


def _index_vars(a: Access) -> list[str]:
    return [v for i in a.indices for v in i.variables]


def _pivot(
    e: Affine, lhs: tuple[str, ...], solved: dict[str, Affine], body: Expr, access: Access
) -> str:
    """The variable of ``e`` to solve for: coefficient ±1, not the gradient's own nor
    solved already; one that another access reads plainly (which keeps its range) first."""
    candidates = [v for v, c in e.terms if abs(c) == 1 and v not in lhs and v not in solved]
    if not candidates:
        raise UnsupportedError(
            f"the gradient through {access} cannot be written as a statement: one of its "
            "indices has no variable of coefficient 1 or -1 left to solve for (a repeated "
            "or strided-only index)"
        )
    kept = [v for v in candidates if _kept_in_range(v, body)]
    return (kept or candidates)[0]


def _kept_in_range(v: str, body: Expr) -> bool:
    """Whether some access of ``body`` reads ``v`` as a plain index, so that ``v`` out of
    its range reads zero there."""
    return any(i.single_variable == v for a in accesses(body) for i in a.indices)


def _ordered_free(e: Expr) -> list[str]:
    """The free variables of ``e`` in order of first appearance."""
    free = free_variables(e)
    seen: dict[str, None] = {}
    for a in accesses(e):
        for i in a.indices:
            for v in i.variables:
                if v in free:
                    seen.setdefault(v, None)
    return list(seen)


def _with_extents(d: Derived, origin: dict[str, str]) -> Derived:
    """``d`` with the variables whose extents its operands' plain indices do not fix, and
    where each comes from: its forward variable (``origin`` maps renamed variables to
    theirs), or for the gradient's own variables, a mode of ``wrt``."""
    if d.statement is None:
        return d
    plain = {i.single_variable for a in accesses(d.statement.rhs) for i in a.indices}
    wanted = [v for v in d.lhs if v not in plain]
    wanted += [v for s in sums(d.statement.rhs) for v in s.vars if v not in plain]
    sources = tuple((v, _source(v, d.lhs, origin)) for v in dict.fromkeys(wanted))
    return replace(d, extents=sources)


def _source(v: str, lhs: tuple[str, ...], origin: dict[str, str]) -> str | int:
    """Where ``v``'s extent comes from: a mode of the operand for its own variables,
    else the forward variable ``v`` stands for."""
    return lhs.index(v) if v in lhs else _forward(v, origin)


def _forward(v: str, origin: dict[str, str]) -> str:
    while v in origin:
        v = origin[v]
    return v
