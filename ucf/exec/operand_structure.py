"""A sparse output with an operand's structure (``2*A(i,j)``, ``A(i,j)/x(i)``): its
positions are that operand's, so a call copies them instead of running the pass that
counts them, and a replay (``ucf.exec.replay``) allocates the output again from them.

The lowerer finds such an output (``AssemblyMixin._same_structure``): dense levels
above one compressed level, the operand stored so too and indexed by the output's
variables, a statement that is zero wherever the operand is. Each of its positions then
appends one output entry, in order, and the compute pass writes every coordinate and
value, reading the operand's positions rather than the output's. Counting them
(zeroing, a pass over the rows, a running sum) cost a 20,000-row ``2*A`` about as much
as the compute pass, and the call's Python around it more. The positions are copied, as
scipy's ``2*A`` copies them: an output sharing them would change when the user writes
the operand's in place.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ucf.format.construction import trusted
from ucf.format.tensor import Tensor


def positions(src: np.ndarray, into: np.ndarray | None = None) -> np.ndarray:
    """The output's positions from the operand's ``src``: less its first (0 in a canonical
    operand), in a new array or ``into``."""
    first = src.item(0)
    if into is None:
        return src - first if first else src.copy()
    if first:
        np.subtract(src, first, out=into)
    else:
        np.copyto(into, src)
    return into


class Rebuilt:
    """What a replay of a call with such an output needs to make a new one: where the
    operand's positions are, and where the output's positions, coordinates and values
    go among the compute function's arguments. The counts array the first call gave the
    kernel stays with it, updated on each replay."""

    __slots__ = ("src", "level", "counts", "pos_at", "crd_at", "shape", "format", "index_dtype")

    def __init__(
        self,
        src: np.ndarray,
        level: int,
        counts: np.ndarray,
        roles: list[tuple],
        result: Tensor,
        name: str,
    ) -> None:
        """``src`` is the operand's positions (held until ``watch``), ``roles`` the compute
        function's parameter roles, ``name`` the output's."""
        self.src = src
        self.level, self.counts = level, counts
        self.pos_at = roles.index(("pos", name, level))
        self.crd_at = roles.index(("crd", name, level))
        self.shape, self.format, self.index_dtype = result.shape, result.format, result.index_dtype

    def watch(self, died: Callable) -> None:
        """Hold the operand's positions by weak reference from now on: a replay runs only
        while the operand's probes match, so while it holds them; ``died`` ends the
        replay when they go (a view the call bound dies with it)."""
        self.src = weakref.ref(self.src, died)

    def output(
        self,
        args: list[Any],
        take: Callable[[int, np.dtype], tuple[np.ndarray, int]],
        dtype: np.dtype,
    ) -> tuple[Tensor, int]:
        """A new output, its positions copied and their addresses, and its coordinates',
        put in ``args``; the output and the address of its values. ``take`` gives ``n``
        uninitialized elements of a dtype and their address."""
        src = self.src()
        nnz = src.item(-1) - src.item(0)
        pos, args[self.pos_at] = take(len(src), self.index_dtype)
        positions(src, pos)
        crd, args[self.crd_at] = take(nnz, self.index_dtype)
        vals, address = take(nnz, dtype)
        self.counts[self.level] = nnz
        levels: list[dict[str, np.ndarray]] = [{} for _ in range(self.format.order)]
        levels[self.level] = {"pos": pos, "crd": crd}
        return trusted(self.shape, self.format, levels, vals, self.index_dtype), address


def rebuilds(result: Tensor) -> bool:
    """Whether a replay can make ``result``, in the format the kernel computed, again:
    its level with an operand's positions holds a pos and a crd (``Compressed.allocate``)
    and no other level holds an array."""
    return sum(map(len, result.levels)) == 2
