"""Nested sums of a derived gradient, hoisted into statements of their own.

A derivative often reads a value the forward statement summed: the gradient of
``y(i) = tanh(sum(k, A(i,k) * x(k)))`` reads ``1 - tanh(s(i))^2`` with ``s`` that
sum, and reads it twice. Left in place, each copy would be recomputed for every
entry of the gradient, and a gradient stored in a blocked sparse format could
not be appended in order around it. So every maximal nested sum becomes a
temporary, ``inner_k(i) = sum(k, A(i,k) * x(k))``, computed first by its own
dense kernel over its free variables, and read where the sum was; equal sums
(up to the names of their own variables) share one temporary.
"""

from __future__ import annotations

from dataclasses import dataclass

from ucf.lang.affine import Affine
from ucf.lang.ast import Access, Expr, Statement, Sum, children, with_children
from ucf.lang.reductions import free_variables
from ucf.lang.rewrite import fresh, rename


@dataclass(frozen=True)
class Temporary:
    """A hoisted sum: ``statement`` computes ``name`` over ``variables``."""

    name: str
    variables: tuple[str, ...]
    statement: Statement


class Hoister:
    """Replaces nested sums by temporaries, collecting one statement per distinct sum."""

    def __init__(self, taken: set[str]):
        self.taken = taken
        self.found: dict[str, Temporary] = {}

    def __call__(self, e: Expr) -> Expr:
        if isinstance(e, Sum):
            return self._temporary(e)
        return with_children(e, [self(c) for c in children(e)])

    def _temporary(self, s: Sum) -> Access:
        variables = tuple(sorted(free_variables(s)))
        key = f"{variables}:{_canonical(s)}"
        if key not in self.found:
            name = fresh("inner_" + "_".join(s.vars), self.taken)
            self.taken.add(name)
            lhs = Access(name, tuple(Affine.var(v) for v in variables))
            self.found[key] = Temporary(name, variables, Statement(lhs, "=", s))
        t = self.found[key]
        return Access(t.name, tuple(Affine.var(v) for v in t.variables))

    @property
    def temporaries(self) -> tuple[Temporary, ...]:
        return tuple(self.found.values())


def _canonical(e: Expr) -> str:
    """``e``'s text with the variables of its sums renamed in order of appearance, so that
    sums differing only in those names compare equal."""
    count = 0

    def go(x: Expr) -> Expr:
        nonlocal count
        if isinstance(x, Sum):
            names = {}
            for v in x.vars:
                names[v] = f"_{count}"
                count += 1
            return Sum(tuple(names.values()), go(rename(x.body, names)))
        return with_children(x, [go(c) for c in children(x)])

    return str(go(e))
