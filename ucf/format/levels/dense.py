"""Dense (U) levels: every coordinate of the dimension under each parent."""

from __future__ import annotations

import numpy as np

from ucf.format.levels.base import LevelKind


class Dense(LevelKind):
    output = "insert"

    def bounds(self, arrays, parent, segment_end, dim):
        from ucf.ir.nodes import add, mul

        return mul(parent, dim), add(mul(parent, dim), dim)

    def coordinate(self, arrays, pos, parent=None, dim=None):
        from ucf.ir.nodes import mul, sub

        return sub(pos, mul(parent, dim))

    def locate(self, parent, coord, dim):
        from ucf.ir.nodes import add, mul

        return add(mul(parent, dim), coord)

    def child_range(self, arrays, lo, hi, dim):
        from ucf.ir.nodes import mul

        return mul(lo, dim), mul(hi, dim)

    def parent_walk(self, arrays, dim, child, first, rng, parent):
        from ucf.ir import nodes as ir

        at_first = ir.Var(f"{parent.name}_first", ir.I64)
        return (
            [ir.Decl(at_first, ir.Bin("/", first, dim))],
            [ir.Decl(parent, ir.Bin("/", child, dim))],
            at_first,
        )

    def allocate(self, parent_count, count, dim, idt, empty):
        return {}, parent_count * dim

    def size(self, arrays, parent_count, dim):
        return parent_count * dim

    def check(self, where, arrays, dim, unique, state):
        state.count *= dim

    def pack(self, lvl, run_end, state):
        state.parent *= state.dims[lvl]
        state.parent += state.lc[:, lvl]
        state.count *= state.dims[lvl]
        return {}

    def unpack(self, arrays, dim, cols, count):
        cols = [np.repeat(c, dim) for c in cols]
        cols.append(np.tile(np.arange(dim, dtype=np.int64), count))
        return cols, count * dim


DENSE = Dense("U", "dense", (), full=True, can_locate=True)
