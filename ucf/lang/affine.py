"""Affine index forms ``sum(c_v * v) + c0`` with integer coefficients."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Affine:
    """An affine index; ``terms`` is sorted so equal forms compare and hash equal."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def var(name: str) -> Affine:
        return Affine(((name, 1),), 0)

    @staticmethod
    def constant(value: int) -> Affine:
        return Affine((), value)

    @staticmethod
    def _make(coeffs: dict[str, int], const: int) -> Affine:
        return Affine(tuple(sorted((v, c) for v, c in coeffs.items() if c != 0)), const)

    def __add__(self, other: Affine) -> Affine:
        coeffs = dict(self.terms)
        for v, c in other.terms:
            coeffs[v] = coeffs.get(v, 0) + c
        return Affine._make(coeffs, self.const + other.const)

    def scale(self, k: int) -> Affine:
        return Affine._make({v: c * k for v, c in self.terms}, self.const * k)

    def __neg__(self) -> Affine:
        return self.scale(-1)

    def __sub__(self, other: Affine) -> Affine:
        return self + (-other)

    @property
    def variables(self) -> tuple[str, ...]:
        return tuple(v for v, _ in self.terms)

    @property
    def is_constant(self) -> bool:
        return not self.terms

    @property
    def single_variable(self) -> str | None:
        """The variable when the index is exactly ``v``; None for anything else."""
        if len(self.terms) == 1 and self.terms[0][1] == 1 and self.const == 0:
            return self.terms[0][0]
        return None

    def __str__(self) -> str:
        parts = []
        for v, c in self.terms:
            parts.append(v if c == 1 else f"-{v}" if c == -1 else f"{c}*{v}")
        if self.const or not parts:
            parts.append(str(self.const))
        text = " + ".join(parts)
        return text.replace("+ -", "- ")

    def coefficient(self, v: str) -> int:
        return dict(self.terms).get(v, 0)

    def without(self, v: str) -> Affine:
        """The index with ``v``'s term dropped: the offset when ``v`` is the base."""
        return Affine(tuple(t for t in self.terms if t[0] != v), self.const)

    def base(self, position: dict[str, int]) -> str | None:
        """The variable bound last in a loop order: the one the access is resolved at."""
        if not self.terms:
            return None
        return max(self.variables, key=lambda v: position[v])

    def interval(self, extent: Callable[[str], str]) -> tuple[Affine, Affine]:
        """Least and greatest value over ``0 <= v < |v|``, as affine forms in the extents
        (``extent(v)`` names ``|v|``), so they can be printed, evaluated or lowered."""
        lo = hi = Affine.constant(self.const)
        for v, c in self.terms:
            span = Affine.var(extent(v)).scale(c) - Affine.constant(c)  # c * (|v| - 1)
            if c > 0:
                hi = hi + span
            else:
                lo = lo + span
        return lo, hi

    def evaluate(self, values: Mapping[str, Any]) -> Any:
        """The index's value; the values may be ints or sympy expressions."""
        total: Any = self.const
        for v, c in self.terms:
            total = total + c * values[v]
        return total
