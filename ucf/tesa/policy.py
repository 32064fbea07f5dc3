"""What a plan may split an operand into (``ucf.Policy``): the value widths, and the
block shapes with their costs, given or measured on this machine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ucf.errors import OperandError, boundary
from ucf.format.format import Format
from ucf.format.values import Values

#: The values a part of each width is stored with; 32 and 64 bits are the plan's dtype.
VALUES = {4: Values("qint4"), 8: Values("qint8"), 16: Values("float16"), 32: None, 64: None}


def with_width(fmt: Format, bits: int) -> Format:
    """``fmt`` holding values of ``bits`` (``VALUES``). A blocked format has a scale per
    block; any other one per tensor, so that a statement reading the sum of an operand's
    parts never has a per-row scale beside blocks over the same rows (which a blocked
    kernel refuses, docs/formats.md)."""
    values = VALUES[bits]
    if values is None:
        return fmt
    if values.quantized and fmt.blocked:
        values = replace(values, level=1)
    return replace(fmt, values=values)


class Policy:
    """What the hardware offers: the widths it computes in and the cost of a block of
    each shape (a dict from block shape to cost per block, or ``"measure"`` for the
    costs of ucf's blocked kernels on this machine). Inputs at least
    ``min_sparsity`` sparse are split; the others are read dense."""

    @boundary
    def __init__(self, bits: Iterable[int] = (32,), blocks: Any = None, min_sparsity: float = 0.5):
        self.bits = frozenset(_whole(b, "bits") for b in _items(bits, "bits"))
        self.min_sparsity = _fraction(min_sparsity)
        if not self.bits or min(self.bits) < 1:
            raise OperandError(f"Policy: bits must be positive widths, got {sorted(self.bits)}")
        unstored = sorted(self.bits - VALUES.keys())
        if unstored:
            raise OperandError(
                f"Policy: ucf has no storage for {unstored[0]}-bit values; the widths it "
                f"stores are {sorted(VALUES)} (4 and 8 quantized, 16 half precision)"
            )
        if isinstance(blocks, str):
            if blocks != "measure":
                raise OperandError(
                    f"Policy: blocks is a dict from block shape to cost per block, or "
                    f"'measure', not {blocks!r}"
                )
            from ucf.tesa.costs import measured_costs

            blocks = measured_costs()
        if not isinstance(blocks, Mapping | None):
            raise OperandError(
                f"Policy: blocks is a dict from block shape to cost per block, "
                f"not {type(blocks).__name__}"
            )
        self.blocks = {
            tuple(_whole(b, "a block shape") for b in _items(s, "a block shape")): _cost(c)
            for s, c in (blocks or {(1, 1): 1}).items()
        }
        if not self.blocks:
            raise OperandError("Policy: blocks must give at least one block shape")
        bad = [s for s in self.blocks if len(s) != 2 or min(s) < 1]
        if bad:
            raise OperandError(f"Policy: a block shape is two positive sizes, got {bad[0]}")

    def __repr__(self) -> str:
        return (
            f"Policy(bits={sorted(self.bits)}, blocks={self.blocks}, "
            f"min_sparsity={self.min_sparsity})"
        )


def _items(value: Any, what: str) -> list[Any]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise OperandError(f"Policy: {what} must be a collection of integers, got {value!r}")
    return list(value)


def _number(value: Any) -> bool:
    """A real number given as one (not a bool, not a string)."""
    return not isinstance(value, bool) and isinstance(value, int | float | np.number)


def _whole(value: Any, what: str) -> int:
    """An integer given as any number with no fraction: 8 or 8.0, not 8.5 or "8"."""
    if not _number(value):
        raise OperandError(f"Policy: {what} must be integers, got {value!r}")
    if not np.isfinite(value) or value != int(value):
        raise OperandError(f"Policy: {what} must be integers, got {value!r}")
    return int(value)


def _fraction(value: Any) -> float:
    if not _number(value):
        raise OperandError(f"Policy: min_sparsity must be a number in [0, 1], got {value!r}")
    if not 0 <= value <= 1:
        raise OperandError(f"Policy: min_sparsity must be in [0, 1], got {value!r}")
    return float(value)


def _cost(value: Any) -> float:
    if not _number(value):
        raise OperandError(f"Policy: a block's cost must be a number, got {value!r}")
    if not (np.isfinite(value) and value > 0):
        raise OperandError(f"Policy: a block's cost must be positive and finite, got {value!r}")
    return float(value)
