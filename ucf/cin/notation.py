"""Concrete index notation (CIN): the statement plus the loop nest that computes it.

For now a CIN is a perfect ``forall`` nest around one assignment; ``notes``
record every decision concretization made on the user's behalf (operand
conversions, the loop order) so that ``k.cin`` explains the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ucf.format.format import Format
from ucf.lang.ast import Statement


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
    parallel: dict = field(default_factory=dict)  # loop -> ucf.cin.schedule.Parallel
    loops: list[str] = field(default_factory=list)  # scheduled loop variables, outer to inner
    bounds: dict[str, tuple[int, str]] = field(default_factory=dict)  # var -> (extent, kind)

    @property
    def reduction_vars(self) -> list[str]:
        out = set(self.output_vars)
        return [v for v in self.order if v not in out]

    @property
    def output_vars(self) -> list[str]:
        return [idx.single_variable for idx in self.statement.lhs.indices]

    def __str__(self) -> str:
        s = self.statement
        op = "+=" if (s.op == "+=" or self.reduction_vars) else "="
        text = f"{s.lhs} {op} {s.rhs}"
        for v in reversed(self.loops or self.order):
            text = f"forall({v}, {text})"
        lines = [text]
        lines += [f"  # {n}" for n in self.notes]
        return "\n".join(lines)
