"""Unordered compressed (Q) levels: compressed segments whose coordinates come in any order.

The arrays are a compressed level's (``pos`` and ``crd``), and every coordinate
appears at most once in its segment, but nothing orders them.  That is what an
index built out of order leaves: threads that claim slots with an atomic counter
(SparDA's online index of nonzero micro-tiles, :func:`ucf.stile_index`) write each
segment in whatever order they finish, and sorting it afterwards would cost more
than the kernel that reads it.

Without order there is no merge and no binary search: the lowerer refuses to
co-iterate the level with another operand or to search it (an intersection with
a CSR operand, an add of two such operands), and lets it drive its loop only when
every other access of the variable can be located (dense).  Which is all a
gather needs: over a permutation-invariant variable (``ucf.invariance``) the
order of the terms does not change the result.

As an output it is appended like a compressed level, and a workspace (Gustavson
SpGEMM) hands its coordinates over in the order they were first touched instead of
sorting them: what scipy's sparse product returns (``has_sorted_indices`` False).
"""

from __future__ import annotations

from ucf.errors import FormatError
from ucf.format.levels import checks
from ucf.format.levels.compressed import Compressed


class Unordered(Compressed):
    def check(self, where, arrays, dim, unique, state):
        """A compressed level's checks but sortedness: a unique level's segments still
        may not repeat a coordinate."""
        super().check(where, arrays, dim, unique, state)
        if not unique:
            return
        pos, crd = arrays["pos"], arrays["crd"]
        found = checks.repeat(pos, crd, dim)
        if found is not None:
            first, at = found
            raise FormatError(
                f"{where}: coordinate {int(crd[at])} repeats in the segment of parent position "
                f"{checks.parent_of(pos, at)} (positions {first} and {at})"
            )

    def searched(self):
        """Compressed: the same arrays, each segment sorted."""
        from ucf.format.levels.compressed import COMPRESSED

        return COMPRESSED


UNORDERED = Unordered(
    "Q", "unordered compressed", ("pos", "crd"), full=False, can_locate=False, ordered=False
)
