"""The parsed statement: accesses with affine indices, arithmetic, = or +=."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from ucf.errors import ShapeError
from ucf.lang.affine import Affine


class Expr:
    """Base of right-hand-side expressions; nodes are immutable and hashable."""

    def __str__(self) -> str:
        return text(self)

    @cached_property
    def _accesses(self) -> tuple[Access, ...]:
        """Kept on the node, which never changes: every kernel call asks for its
        statement's operands, and walking the tree each time cost microseconds."""
        if isinstance(self, Access):
            return (self,)
        return tuple(a for c in children(self) for a in c._accesses)


@dataclass(frozen=True)
class Access(Expr):
    tensor: str
    indices: tuple[Affine, ...]


@dataclass(frozen=True)
class Literal(Expr):
    value: float | int


@dataclass(frozen=True)
class Neg(Expr):
    operand: Expr


_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


@dataclass(frozen=True)
class Binary(Expr):
    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Call(Expr):
    """An element-wise function (see ``ucf.lang.functions``) applied to its arguments."""

    fn: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Sum(Expr):
    """``body`` reduced over ``vars`` by ``op``: a sum, written ``sum(j, ...)`` or implied
    by a variable that appears only on the right-hand side (see ``ucf.lang.reductions``),
    or the largest or smallest value, written ``max(j, ...)`` or ``min(j, ...)``. One
    node for all three, since every stage places and nests them alike; only the
    combining step and its identity differ (``ucf.lang.algebra``)."""

    vars: tuple[str, ...]
    body: Expr
    op: str = "sum"


def text(e: Expr, names: Mapping[int, str] | None = None) -> str:
    """The expression as statement text; ``names`` maps the ids of nodes to print as a
    name instead (a nested sum shown as the temporary that holds it)."""
    names = names or {}

    def paren(x: Expr, prec: int) -> str:
        if isinstance(x, Binary) and _PREC[x.op] < prec and id(x) not in names:
            return f"({go(x)})"
        return go(x)

    def go(x: Expr) -> str:
        if id(x) in names:
            return names[id(x)]
        if isinstance(x, Access):
            return f"{x.tensor}({', '.join(map(str, x.indices))})"
        if isinstance(x, Literal):
            return repr(x.value)
        if isinstance(x, Neg):
            return f"-{paren(x.operand, 3)}"
        if isinstance(x, Binary):
            p = _PREC[x.op]
            return f"{paren(x.left, p)} {x.op} {paren(x.right, p + 1 if x.op in '-/' else p)}"
        if isinstance(x, Call):
            return f"{x.fn}({', '.join(go(a) for a in x.args)})"
        assert isinstance(x, Sum)
        return f"{x.op}({', '.join(x.vars)}, {go(x.body)})"

    return go(e)


@dataclass(frozen=True)
class Statement:
    lhs: Access
    op: str  # "=" or "+="
    rhs: Expr
    text: str = ""

    def __str__(self) -> str:
        return f"{self.lhs} {self.op} {self.rhs}"


def children(e: Expr) -> tuple[Expr, ...]:
    """The sub-expressions of ``e``, left to right."""
    if isinstance(e, Neg):
        return (e.operand,)
    if isinstance(e, Binary):
        return (e.left, e.right)
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Sum):
        return (e.body,)
    return ()


def with_children(e: Expr, kids: Sequence[Expr]) -> Expr:
    """``e`` with its sub-expressions (as ``children`` lists them) replaced by ``kids``:
    the one place that knows how each node is rebuilt, for every rewrite of a tree."""
    if isinstance(e, Neg):
        return Neg(kids[0])
    if isinstance(e, Binary):
        return Binary(e.op, kids[0], kids[1])
    if isinstance(e, Call):
        return Call(e.fn, tuple(kids))
    if isinstance(e, Sum):
        return Sum(e.vars, kids[0], e.op)
    return e


def accesses(e: Expr) -> list[Access]:
    """Accesses of an expression in left-to-right order (the operand numbering)."""
    return list(e._accesses)


def index_variables(e: Expr | Access) -> list[str]:
    """Index variables in order of first appearance."""
    seen: dict[str, None] = {}
    for a in accesses(e):
        for idx in a.indices:
            for v in idx.variables:
                seen.setdefault(v, None)
    return list(seen)


def fresh(name: str, taken: set[str]) -> str:
    """``name``, or ``name1``, ``name2``, ... : the first not in ``taken`` (which then
    holds it), for the variables and tensors that rewrites of a statement add."""
    base, k = name, 1
    while name in taken:
        name, k = f"{base}{k}", k + 1
    taken.add(name)
    return name


def statement_orders(stmt: Statement) -> dict[str, int]:
    """Each tensor's order: the number of indices it is accessed with (one number)."""
    orders: dict[str, int] = {}
    for a in [stmt.lhs, *accesses(stmt.rhs)]:
        if a.tensor in orders and orders[a.tensor] != len(a.indices):
            raise ShapeError(
                f"tensor {a.tensor} is accessed with {orders[a.tensor]} and with "
                f"{len(a.indices)} indices"
            )
        orders[a.tensor] = len(a.indices)
    return orders
