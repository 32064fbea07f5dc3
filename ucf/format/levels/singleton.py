"""Singleton (S) levels: one coordinate per parent position, as in COO below the first."""

from __future__ import annotations

import numpy as np

from ucf.errors import FormatError
from ucf.format.levels import checks
from ucf.format.levels.base import LevelKind


class Singleton(LevelKind):
    """Its parent is non-unique, so an output is computed compressed and converted."""

    def bounds(self, arrays, parent, segment_end, dim):
        from ucf.ir.nodes import add, const_like

        end = segment_end if segment_end is not None else add(parent, const_like(parent, 1))
        return parent, end

    def coordinate(self, arrays, pos, parent=None, dim=None):
        from ucf.ir.nodes import Load

        return Load(arrays["crd"], pos)

    def child_range(self, arrays, lo, hi, dim):
        return lo, hi

    def parent_walk(self, arrays, dim, child, first, rng, parent):
        from ucf.ir import nodes as ir

        return [], [ir.Decl(parent, child)], first

    def as_output(self):
        from ucf.format.levels.compressed import COMPRESSED

        return COMPRESSED

    def searched(self):
        """Compressed: its parent then stores each coordinate once, and can be
        searched too."""
        from ucf.format.levels.compressed import COMPRESSED

        return COMPRESSED

    def size(self, arrays, parent_count, dim):
        return parent_count

    def check(self, where, arrays, dim, unique, state):
        crd = arrays["crd"]
        if len(crd) != state.count:
            raise FormatError(
                f"{where}: crd has length {len(crd)}, expected one per parent "
                f"position = {state.count}"
            )
        checks.in_range(where, crd, dim)
        if state.run_eq is None or state.run_pos is None:
            raise FormatError(f"{where}: a singleton level must follow a compressed level")
        prev, cur = crd[:-1], crd[1:]
        q = checks.first_true(state.run_eq & (cur < prev))
        if q is not None:
            q += 1
            raise FormatError(
                f"{where}: crd not sorted within segment of parent position "
                f"{checks.parent_of(state.run_pos, q)} (of level {state.run_level}) at "
                f"position {q} (crd {int(crd[q])} after {int(crd[q - 1])}, with equal "
                f"coordinates at levels {state.run_level} and below)"
            )
        state.run_eq = state.run_eq & (cur == prev)
        if unique:
            q = checks.first_true(state.run_eq)
            if q is not None:
                raise FormatError(
                    f"{where}: duplicate coordinate tuple at positions {q} and {q + 1} "
                    f"within segment of parent position {checks.parent_of(state.run_pos, q + 1)} "
                    f"(of level {state.run_level})"
                )
            state.run_level, state.run_pos, state.run_eq = -1, None, None

    def pack(self, lvl, run_end, state):
        return {"crd": state.lc[state.first, lvl].astype(state.idt)}

    def unpack(self, arrays, dim, cols, count):
        cols.append(arrays["crd"].astype(np.int64))
        return cols, count


SINGLETON = Singleton("S", "singleton", ("crd",), full=False, can_locate=False, branchless=True)
