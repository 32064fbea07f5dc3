"""What a checked schedule hands the lowerer and each call: one record per request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ucf.errors import ShapeError

if TYPE_CHECKING:
    from ucf.lang.ast import Statement


@dataclass(frozen=True)
class Split:
    """``split`` (fixed inner size) or ``divide`` (fixed number of outer parts) of a loop."""

    var: str
    outer: str
    inner: str
    amount: int
    mode: str  # "split" or "divide"


@dataclass(frozen=True)
class Precompute:
    """``precompute(expr, i, iw, w)``: ``expr`` goes through a dense workspace ``w`` over ``iw``.

    ``statement`` is ``w(i) = expr`` over the original variable ``i``, parsed once
    when the command is checked; ``more`` holds a workspace's further variables
    (``W(j,l)``: ``("l",)``), each its own dimension, in that order."""

    expr: str
    var: str
    wvar: str
    name: str
    statement: Statement
    more: tuple[str, ...] = ()


@dataclass(frozen=True)
class Parallel:
    unit: str
    strategy: str
    size: int = 0  # GPUGroup size

    def __str__(self) -> str:
        size = f", {self.size}" if self.size else ""
        return f"{self.unit}{size}, {self.strategy}"


@dataclass(frozen=True)
class Assemble:
    """``assemble(T, strategy[, separately])``: how the sparse output T is built.

    ucf always counts the output's entries in a query pass before it fills them,
    so arrays are exactly sized.  ``Insert`` (TACO's name) lets rows be filled in
    parallel once each row's count is known; ``Append`` appends in loop order.
    ``separately`` gives the query pass loops of its own, named ``q`` + the
    loop's name (``qi``), scheduled apart from the compute pass's.
    """

    tensor: str
    strategy: str
    separately: bool


@dataclass(frozen=True)
class Bound:
    """``bound(var, ..., amount, kind)``: loop ``var`` runs exactly ``amount`` times.

    ``var`` is an index variable, or the outer loop of a ``split`` of one (through
    any number of splits: TACO's ``split(k, kv, thread, 32); bound(kv, ...)``),
    which runs ``ceil(|origin| / divisor)`` times. The trip count depends on an
    extent only known when the kernel is called, so each call checks it.
    """

    var: str
    amount: int
    kind: str
    origin: str
    divisor: int = 1

    def check(self, extents: dict[str, int]) -> None:
        trips = -(-extents[self.origin] // self.divisor)
        if trips == self.amount:
            return
        if self.divisor == 1:
            raise ShapeError(
                f"the schedule bounds index variable {self.var} to exactly {self.amount} "
                f"({self.kind}), but this call has extent {trips} for {self.var}"
            )
        raise ShapeError(
            f"the schedule bounds loop {self.var} to exactly {self.amount} ({self.kind}); it "
            f"runs ceil({self.origin} / {self.divisor}) times, which is {trips} for this "
            f"call's extent {extents[self.origin]} of {self.origin}"
        )


@dataclass(frozen=True)
class Dismantle:
    """``dismantle(v[, values])``: loop ``v`` and every loop around it are unrolled over
    the static operands' patterns (SparTA's primitive), so only live blocks or nonzeros
    are computed; ``values`` also embeds the static operands' values as constants."""

    var: str
    values: bool
