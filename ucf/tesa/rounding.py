"""Bit rounding (SparTA Algorithm 3, ``BitRounding``): widths the hardware computes in.

A TeSA may ask for any width per element; hardware has a few (say 4- and 8-bit
integer instructions). Each width rounds up to the next supported one. Where
more than one supported width remains in the tensor, computing it all in the
wider one may still be faster (one kernel instead of two), so every such choice
is kept as an option and the transformation that follows measures them.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ucf.errors import OperandError, boundary
from ucf.tesa.attribute import TeSA


@boundary
def bit_rounding(tesa: TeSA, hardware: Iterable[int]) -> list[TeSA]:
    """The rounding options of ``tesa`` for the widths in ``hardware``, finest first.

    Option ``k`` rounds every kept element up to the next supported width, and
    then raises every width below the ``k``-th smallest width in use to it: with
    widths 4 and 8 on ``{4, 8}`` hardware the options are "4 and 8" and "all 8";
    on ``{8}`` hardware only "all 8". Pruned elements stay pruned.
    """
    widths = sorted({int(w) for w in hardware})
    if not widths or widths[0] < 1:
        raise OperandError(f"bit_rounding: hardware widths must be positive, got {widths}")
    bits = tesa.bits.astype(np.int64)
    kept = bits > 0
    if not kept.any():
        return [tesa]
    widest = int(bits.max())
    if widest > widths[-1]:
        raise OperandError(
            f"bit_rounding: an element needs {widest} bits, more than the widest supported "
            f"width {widths[-1]} (hardware {widths})"
        )
    rounded = np.where(kept, np.asarray(widths)[np.searchsorted(widths, bits)], 0)
    floors = np.unique(rounded[kept])
    return [TeSA(np.where(kept, np.maximum(rounded, f), 0), block=tesa.block) for f in floors]
