"""The parsed statement: accesses with affine indices, arithmetic, = or +=."""

from __future__ import annotations

from dataclasses import dataclass

from ucf.lang.affine import Affine


class Expr:
    """Base of right-hand-side expressions; nodes are immutable and hashable."""


@dataclass(frozen=True)
class Access(Expr):
    tensor: str
    indices: tuple[Affine, ...]

    def __str__(self) -> str:
        return f"{self.tensor}({', '.join(map(str, self.indices))})"


@dataclass(frozen=True)
class Literal(Expr):
    value: float | int

    def __str__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class Neg(Expr):
    operand: Expr

    def __str__(self) -> str:
        return f"-{_paren(self.operand, 3)}"


_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


@dataclass(frozen=True)
class Binary(Expr):
    op: str
    left: Expr
    right: Expr

    def __str__(self) -> str:
        p = _PREC[self.op]
        right_p = p + 1 if self.op in "-/" else p
        return f"{_paren(self.left, p)} {self.op} {_paren(self.right, right_p)}"


def _paren(e: Expr, prec: int) -> str:
    if isinstance(e, Binary) and _PREC[e.op] < prec:
        return f"({e})"
    return str(e)


@dataclass(frozen=True)
class Statement:
    lhs: Access
    op: str  # "=" or "+="
    rhs: Expr
    text: str = ""

    def __str__(self) -> str:
        return f"{self.lhs} {self.op} {self.rhs}"


def accesses(e: Expr) -> list[Access]:
    """Accesses of an expression in left-to-right order."""
    if isinstance(e, Access):
        return [e]
    if isinstance(e, Neg):
        return accesses(e.operand)
    if isinstance(e, Binary):
        return accesses(e.left) + accesses(e.right)
    return []


def index_variables(e: Expr | Access) -> list[str]:
    """Index variables in order of first appearance."""
    seen: dict[str, None] = {}
    for a in accesses(e):
        for idx in a.indices:
            for v in idx.variables:
                seen.setdefault(v, None)
    return list(seen)
