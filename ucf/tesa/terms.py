"""Terms of the statements a plan writes: sums taken apart and put together, reads of
split operands replaced by their parts, the functions a reader computes in place,
and fresh names.
"""

from __future__ import annotations

from ucf.lang.ast import (
    Access,
    Binary,
    Call,
    Expr,
)
from ucf.lang.rewrite import fresh, map_accesses


def added_terms(e: Expr, ops: str = "+") -> list[Expr]:
    """The terms that ``e`` joins by ``ops`` at its top (``a + b + c``: a, b, c; with
    ``"+-"``, ``a - b + c`` too)."""
    if isinstance(e, Binary) and e.op in ops:
        return [*added_terms(e.left, ops), *added_terms(e.right, ops)]
    return [e]


def sum_of(terms: list[Expr]) -> Expr:
    out = terms[0]
    for t in terms[1:]:
        out = Binary("+", out, t)
    return out


#: Element-wise functions a plan computes in the statement that reads their result
#: (``_fused``): zero-preserving, so ``relu(T)`` is zero wherever ``T`` is, as the
#: attribute propagation gave ``U = relu(T)``, and lowered to a compare-and-pick
#: (``ucf.lower.elementwise``), which the register tiles compute on the vectors they load
#: (``ucf.passes.registers``): cheaper than writing ``U`` and reading it back, a pass
#: over it (0.17 of 5.5 ms on one thread in bench/tesa_program.py).
FUSED = frozenset({"relu"})


def fused_operand(e: Expr) -> Access | None:
    """The access ``e`` reads: ``e`` itself, or the argument of a ``FUSED`` function
    of one access; None for anything else."""
    if isinstance(e, Call) and e.fn in FUSED and len(e.args) == 1:
        e = e.args[0]
    return e if isinstance(e, Access) else None


def with_parts(e: Expr, name: str, parts: tuple[str, ...]) -> Expr:
    """``e`` with every access of ``name`` read as the sum of ``parts``."""

    def read(a: Access) -> Expr:
        return a if a.tensor != name else sum_of([Access(p, a.indices) for p in parts])

    return map_accesses(e, read)


def take_fresh(stem: str, taken: set[str]) -> str:
    """A new name, kept in ``taken`` so that the next one differs."""
    name = fresh(stem, taken)
    taken.add(name)
    return name
