"""Concrete index notation (CIN): the statement plus the loop nest that computes it.

The loop order covers every index variable.  The variables the whole
right-hand side is summed over are the outer reduction, whose loops add into
the output; every other sum is nested, and its loops compute a temporary at
the point where the variables its value depends on are fixed: TACO's
``where(consumer, producer)``.  ``notes`` record every decision made on the
user's behalf (operand conversions, the loop order) so that ``k.cin``
explains the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ucf.format.format import Format
from ucf.lang.ast import Expr, Statement, Sum, children, text
from ucf.lang.reductions import free_variables, peel, sums, temporary


@dataclass(frozen=True)
class Slot:
    """One operand storage the kernel reads: a tensor in one particular format."""

    name: str  # parameter prefix in the generated code
    tensor: str  # the user's tensor name
    format: Format


@dataclass
class CIN:
    statement: Statement
    order: list[str]
    slots: dict[int, Slot]  # access number (left to right on the rhs) -> storage
    output_format: Format
    notes: list[str] = field(default_factory=list)
    parallel: dict = field(default_factory=dict)  # loop -> ucf.schedule.Parallel
    loops: list[str] = field(default_factory=list)  # scheduled loop variables, outer to inner
    bounds: dict = field(default_factory=dict)  # loop -> ucf.schedule.Bound
    origins: dict[str, list[str]] = field(default_factory=dict)  # scheduled loop -> variables
    # A blocked variable's place in its block -> (the variable, its block's loop, the size)
    blocks: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    # An offset of a sparse operand's repeated variable (ucf.cin.diagonals) -> the variable
    diagonals: dict[str, str] = field(default_factory=dict)
    # Accesses (by number) a precompute's producer walks as stored in loops of its own
    # (``ucf.schedule.own_order``) -> the workspace
    walked: dict[int, str] = field(default_factory=dict)

    @property
    def reduction_vars(self) -> list[str]:
        """The outer reduction's variables, in loop order."""
        summed = set(peel(self.statement.rhs)[0])
        return [v for v in self.order if v in summed]

    @property
    def nested_vars(self) -> set[str]:
        """Variables of nested sums: their loops run inside a temporary's producer."""
        return {v for s in sums(peel(self.statement.rhs)[1]) for v in s.vars}

    @property
    def fixed(self) -> dict[str, int]:
        """Extents known when compiling: a block's places run over the block's size, the
        offset of a repeated variable over one value."""
        fixed = {inner: size for inner, (_, _, size) in self.blocks.items()}
        return fixed | dict.fromkeys(self.diagonals, 1)

    @property
    def output_vars(self) -> list[str]:
        return [idx.single_variable for idx in self.statement.lhs.indices]

    def __str__(self) -> str:
        s = self.statement
        op = "+=" if (s.op == "+=" or self.reduction_vars) else "="
        body = peel(s.rhs)[1]
        loops = self.loops or self.order
        nested = self.nested_vars
        outer = [v for v in loops if not set(self.origins.get(v, [v])) & nested]
        lines = [self._render(body, outer, set(), str(s.lhs), op, {})]
        lines += [f"  # {n}" for n in self.notes]
        return "\n".join(lines)

    def _loops_of(self, variables: set[str]) -> list[str]:
        loops = self.loops or self.order
        return [v for v in loops if set(self.origins.get(v, [v])) <= variables]

    def _render(self, body: Expr, loops, bound: set[str], lhs: str, op: str, temps) -> str:
        """``forall`` over ``loops`` around ``lhs op body``, with a ``where`` wherever a
        nested sum's variables are fixed and its temporary can be computed.  ``temps``
        names the sums already computed (by node id)."""
        ready = [x for x in _sums_outside(body, temps) if free_variables(x) <= bound]
        if ready:
            temps = {**temps, **{id(x): temporary(x.vars, x.op) for x in ready}}
            text_ = self._render(body, loops, bound, lhs, op, temps)
            for x in ready:
                combine = "+=" if x.op == "sum" else f"{x.op}="
                producer = self._render(
                    x.body, self._loops_of(set(x.vars)), bound, temps[id(x)], combine, temps
                )
                text_ = f"where({text_}, {producer})"
            return text_
        if not loops:
            return f"{lhs} {op} {text(body, temps)}"
        v = loops[0]
        inner = self._render(body, loops[1:], bound | self._completed(v), lhs, op, temps)
        return f"forall({v}, {inner})"

    def _completed(self, v: str) -> set[str]:
        """The variables fixed once loop ``v`` is entered: those no later loop iterates
        (after a split, ``i`` is fixed inside ``i1``, not inside ``i0``)."""
        loops = self.loops or self.order
        later = loops[loops.index(v) + 1 :]
        rest = {o for w in later for o in self.origins.get(w, [w])}
        return set(self.origins.get(v, [v])) - rest


def _sums_outside(e: Expr, temps) -> list[Sum]:
    """The sums of ``e`` that are neither inside another sum nor already computed."""
    if id(e) in temps:
        return []
    if isinstance(e, Sum):
        return [e]
    return [x for c in children(e) for x in _sums_outside(c, temps)]
