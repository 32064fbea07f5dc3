"""Operands whose pattern is known when compiling (``ucf.compile(..., static=...)``).

A kernel specialized to a pattern (``ucf.passes.dismantle``) is right only for tensors
of that pattern, so the pattern (shape and index arrays; the values too when the
kernel embeds them) is part of the kernel's cache key, and each call compares its
operand, in the kernel's format, array by array with a copy taken when compiling:
one of another pattern is refused. The copy is what makes the check sound: the
object given at compile time may have been changed in place since (its values
rewritten, say, under a kernel that embeds them), and it would pass a comparison
with itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ucf.errors import OperandError
from ucf.format.format import Format
from ucf.format.interop import as_tensor
from ucf.format.tensor import Tensor
from ucf.lang.ast import Statement, accesses
from ucf.schedule.commands import Command, DismantleCommand


@dataclass(frozen=True)
class Static:
    """One static operand: a copy of it in the kernel's format and dtypes, as compiled."""

    name: str
    tensor: Tensor
    values: bool  # the kernel embeds its values

    def digest(self) -> str:
        """A hash of the pattern (and of the values, when embedded)."""
        h = hashlib.sha256(repr((str(self.tensor.format), self.tensor.shape)).encode())
        for level in self.tensor.levels:
            for key in sorted(level):
                h.update(key.encode())
                h.update(np.ascontiguousarray(level[key]).tobytes())
        if self.values:
            h.update(str(self.tensor.vals.dtype).encode())
            h.update(np.ascontiguousarray(self.tensor.vals).tobytes())
        return h.hexdigest()[:32]

    def check(self, operand: Tensor, index_dtype: np.dtype) -> None:
        """Refuse an operand of another pattern (or other values, when embedded)."""
        ref = self.tensor
        held = None if ref.format.values else ref.dtype
        t = operand.convert(ref.format, index_dtype=index_dtype, dtype=held)
        why = None
        if t.shape != ref.shape:
            why = f"its shape is {t.shape}, the static one's {ref.shape}"
        else:
            for lvl, (mine, theirs) in enumerate(zip(t.levels, ref.levels, strict=True)):
                for key in sorted(theirs):
                    if not np.array_equal(mine[key], theirs[key]):
                        why = f"its level {lvl} {key} array differs"
                        break
                if why:
                    break
        nan = ref.vals.dtype.kind in "fc"  # an embedded NaN equals itself
        if why is None and self.values and not np.array_equal(t.vals, ref.vals, equal_nan=nan):
            why = "its values differ from the ones the kernel embeds (dismantle(..., values))"
        if why is not None:
            raise OperandError(
                f"operand {self.name} has another pattern than the static {self.name} the "
                f"kernel was compiled for: {why}; compile a kernel with static={{'{self.name}'"
                ": ...} for it, or leave it dynamic"
            )


def prepare(
    static: Mapping[str, Any],
    expr: str,
    formats: Mapping[str, Format],
    commands: Sequence[Command] | None,
    dtype: np.dtype,
    index_dtype: np.dtype,
) -> dict[str, Static]:
    """The static operands in the kernel's formats, checked against the statement."""
    from ucf.lang.parser import parse_statement  # lark, only for kernels with static operands

    stmt = parse_statement(expr)
    names = {a.tensor for a in accesses(stmt.rhs)}
    values = embeds_values(commands)
    out = {}
    for name, given in static.items():
        if name not in names:
            raise OperandError(
                f"static= names {name}, which is not an operand of {stmt} (operands: "
                f"{', '.join(sorted(names))})"
            )
        fmt = formats.get(name) or Format.dense(len(_access(stmt, name).indices))
        # A format stating its values says how the operand holds them (a quantized
        # one's stored integers are not a dtype to convert to).
        held = None if fmt.values else dtype
        t = as_tensor(given, format=fmt, name=name, dtype=held, index_dtype=index_dtype)
        out[name] = Static(name, t.copy(), values)
    return out


def embeds_values(commands: Sequence[Command] | None) -> bool:
    """Whether the schedule embeds the static values (``dismantle(v, values)``)."""
    return any(isinstance(c, DismantleCommand) and c.request.values for c in commands or ())


def _access(stmt: Statement, name: str):
    return next(a for a in accesses(stmt.rhs) if a.tensor == name)
