"""A copy whose output is the conversion it reads: ``C(j,i) = A(i,j)`` into CSR from
CSR (``A.T.tocsr()``), ``C(i,j) = A(i,j)`` into CSC (``A.tocsc()``).

No loop order follows both the operand's storage and the sparse output's, so the
kernel reads the operand converted before each call (scipy's linear conversion, or
``ucf.format.convert``'s) and then copies every entry into the output, assembling it
level by level: about as much work again as the conversion. But the converted
operand, walked in the output's level order, already holds the output's arrays: the
same levels over the same coordinates, the statement only renaming the modes. So the
default returns that conversion itself, relabelled (``Kernel`` does it where the plan
says so), and the kernel is not called; a schedule the user gives keeps the kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from ucf.cin.notation import CIN
from ucf.format.format import Format
from ucf.lang.ast import Access


@dataclass(frozen=True)
class Relabelled:
    """The operand the output copies, and the format whose storage of it is the
    output's (the output's level kinds over the operand's modes)."""

    tensor: str
    format: Format

    def note(self, out: str) -> str:
        """The line ``k.cin`` shows."""
        return (
            f"default: output {out} is {self.tensor} converted to '{self.format.name}' and "
            f"relabelled (each call returns the conversion: a copy of its entries in the "
            f"same order would cost as much again, so the kernel is not called)"
        )


def relabelled(cin: CIN, requested: Format, formats: Mapping[str, Format]) -> Relabelled | None:
    """What the output of ``cin`` is when its statement copies one operand (stored in
    its format of ``formats``) into a sparse output of format ``requested`` with its
    modes permuted and nothing computed, and the kernel reads that operand converted;
    else None."""
    stmt = cin.statement
    rhs = stmt.rhs
    if stmt.op != "=" or not isinstance(rhs, Access) or cin.blocks or cin.diagonals:
        return None
    stored = formats[rhs.tensor]
    if cin.bounds or cin.slots[0].name == cin.slots[0].tensor:
        return None  # read as stored: the kernel copies without a conversion to reuse
    out_vars = [i.single_variable for i in stmt.lhs.indices]
    in_vars = [i.single_variable for i in rhs.indices]
    if None in out_vars or len(set(out_vars)) != len(out_vars) or set(out_vars) != set(in_vars):
        return None
    if len(in_vars) != len(out_vars) or requested.is_dense or requested.blocked:
        return None
    if requested.fixed_width or any(f.values is not None for f in (requested, stored)):
        return None
    if requested.fill != stored.fill:
        return None
    modes = tuple(in_vars.index(out_vars[m]) for m in requested.mode_order)
    return Relabelled(rhs.tensor, replace(requested, maps=modes))
