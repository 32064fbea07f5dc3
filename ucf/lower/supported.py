"""What the lowerer refuses before it builds anything, by what the user wrote.

Split out of ``ucf.lower.lowerer``, whose ``Lowerer`` calls ``check_supported`` first:
these read only the statement, its formats and the schedule, never the state the
lowering builds, so they are plain functions. The fill values refused are those
the rules of ``ucf.lower.lattice`` do not carry through a statement.
"""

from __future__ import annotations

import math

from ucf.cin.notation import CIN
from ucf.errors import UnsupportedError
from ucf.ir import nodes as ir
from ucf.lang.ast import accesses
from ucf.lower import elementwise
from ucf.lower.lattice import Func, Op, Term, has_division, operands, subterms, walk
from ucf.schedule import Applied


def check_supported(cin: CIN, term: Term, value_type: str, applied: Applied | None) -> None:
    """Refuse what the lowerer cannot build for ``cin`` (its right-hand side ``term``, in
    ``value_type``, scheduled by ``applied``), naming what the user wrote: a repeated
    output variable, a sparse divisor, division in an integer kernel, an elementwise
    function the type does not have, and the fill values of ``_check_fills``."""
    stmt = cin.statement
    if len(set(cin.output_vars)) != len(cin.output_vars):
        raise UnsupportedError(f"output {stmt.lhs}: a repeated index variable is not supported")
    _check_divisors(term, cin)
    if value_type in ir.INT_TYPES and has_division(term):
        raise UnsupportedError("division is not supported in integer kernels")
    for t in walk(term):
        if isinstance(t, Func):
            elementwise.check(t.fn, value_type)
    _check_fills(cin, value_type, applied)


def _check_fills(cin: CIN, value_type: str, applied: Applied | None) -> None:
    """Refuse, by tensor, the fill values the rules of ``ucf.lower.lattice`` do not
    carry through this statement."""
    stmt = cin.statement
    rhs_accesses = accesses(stmt.rhs)
    filled = [(n, s) for n, s in cin.slots.items() if s.format.fill]
    out_fill = cin.output_format.fill
    if out_fill:
        filled.append((-1, None))
    for n, slot in filled:
        name = slot.tensor if slot else stmt.lhs.tensor
        fill = slot.format.fill if slot else out_fill
        where = f"tensor {name} (format '{(slot.format if slot else cin.output_format).name}')"
        if value_type in ir.INT_TYPES and math.isinf(fill):
            raise UnsupportedError(
                f"{where} reads absent entries as {fill}, which a {value_type} kernel cannot "
                "hold; compute in float32 or float64"
            )
        access = rhs_accesses[n]
        if slot and any(ix.single_variable is None for ix in access.indices):
            if any(v in cin.diagonals for ix in access.indices for v in ix.variables):
                raise UnsupportedError(
                    f"{where}: reading {name} with a repeated index variable (a diagonal) "
                    f"is not supported when its fill value is not 0; store {name} with "
                    "fill 0 (the default) or dense"
                )
            raise UnsupportedError(
                f"{where}: an operand with a fill value other than 0 and an affine index "
                f"({access}) is not supported"
            )
        if applied is not None and applied.precompute:
            raise UnsupportedError(
                f"precompute in {stmt}: {where} has a fill value other than 0, which a "
                "precompute's zeroed workspace does not carry"
            )
    padded = [
        s
        for n, s in cin.slots.items()
        if s.format.fixed_width
        and any(v in cin.blocks for ix in rhs_accesses[n].indices for v in ix.variables)
    ]
    if filled and padded:
        name = filled[0][1].tensor if filled[0][1] else stmt.lhs.tensor
        split = sorted({b for b, _, _ in cin.blocks.values()})
        raise UnsupportedError(
            f"{stmt.text or stmt}: tensor {padded[0].tensor} has a fixed-width level, "
            f"and {' and '.join(split)} {'runs' if len(split) == 1 else 'run'} in blocks "
            "(of its format, or of another tensor's "
            "on a variable they share): its padding entries, also past a partial block's "
            f"end, would meet {name}'s fill value other than 0 (0 times an infinite fill "
            f"is NaN); store {padded[0].tensor} without a fixed-width level, or the "
            "blocked tensor unblocked"
        )
    if out_fill and cin.reduction_vars:
        raise UnsupportedError(
            f"{stmt}: the output {stmt.lhs.tensor} reads absent entries as {out_fill}, but "
            f"the statement sums over {', '.join(cin.reduction_vars)}, and a sum that "
            "meets no entry is 0; write the sum into an output whose fill is 0"
        )


def _check_divisors(t: Term, cin: CIN) -> None:
    """A sparse divisor would divide by its implicit zeros; refuse rather than guess."""
    for c in subterms(t):
        _check_divisors(c, cin)
    if isinstance(t, Op):
        if t.op == "/":
            for n in operands(t.right):
                slot = cin.slots[n]
                if not slot.format.is_dense:
                    raise UnsupportedError(
                        f"division by sparse tensor {slot.tensor} (format '{slot.format}') would "
                        "divide by its implicit zeros; store the divisor dense"
                    )
