"""Compressed (C) levels, a pos array of segment bounds and the stored coordinates, and
singleton (S) levels, one coordinate per parent position, as in COO below the first.

The two live together because each names the other: below a non-unique compressed
level (COO's) comes a singleton, and a singleton output is computed compressed."""

from __future__ import annotations

import numpy as np

from ucf.errors import FormatError
from ucf.format.levels import checks
from ucf.format.levels.base import LevelKind


class Compressed(LevelKind):
    coordinate_array = "crd"
    output = "append"
    segment_array = "pos"

    def split(self, unique):
        """Below a non-unique compressed level (COO's), each entry's place in its block is
        a singleton level, as the coordinate it was cut from would have been."""
        return (self, self) if unique else (self, SINGLETON)

    def bounds(self, arrays, parent, segment_end, dim):
        from ucf.ir.nodes import Load, add, const_like

        if segment_end is not None:
            raise TypeError("a compressed level cannot sit below a non-unique level")
        return (
            Load(arrays["pos"], parent),
            Load(arrays["pos"], add(parent, const_like(parent, 1))),
        )

    def coordinate(self, arrays, pos, parent=None, dim=None):
        from ucf.ir.nodes import Load

        return Load(arrays["crd"], pos)

    def child_range(self, arrays, lo, hi, dim):
        from ucf.ir.nodes import Load

        return Load(arrays["pos"], lo), Load(arrays["pos"], hi)

    def parent_walk(self, arrays, dim, child, first, rng, parent):
        """A binary search over pos for the first position's parent, then a step to the
        next parent whenever the walk crosses a segment end."""
        from ucf.ir import nodes as ir

        pos = arrays["pos"]
        i64 = ir.I64
        lo, hi = ir.Var(f"{parent.name}_l", i64), ir.Var(f"{parent.name}_h", i64)
        mid = ir.Var(f"{parent.name}_m", i64)
        halve = [
            ir.Decl(mid, ir.Bin("/", ir.add(lo, hi), ir.Const(2, i64))),
            ir.If(
                ir.Cmp("<=", ir.cast(ir.Load(pos, mid), i64), first),
                [ir.Assign(lo, mid)],
                [ir.Assign(hi, mid)],
            ),
        ]
        search = [
            ir.Decl(lo, rng[0]),
            ir.Decl(hi, rng[1]),
            ir.While(ir.Cmp(">", ir.sub(hi, lo), ir.Const(1, i64)), halve),
            ir.Decl(parent, lo),
        ]
        nxt = ir.add(parent, ir.Const(1, i64))
        step = ir.While(
            ir.Cmp("<=", ir.cast(ir.Load(pos, nxt), i64), child), [ir.Assign(parent, nxt)]
        )
        return search, [step], parent

    def append(self, arrays, q, coord, index_type):
        from ucf.ir import nodes as ir

        return [ir.Store(arrays["crd"], q, ir.cast(coord, index_type))]

    def close(self, arrays, parent, end, index_type):
        from ucf.ir import nodes as ir

        one = ir.const_like(parent, 1)
        return [ir.Store(arrays["pos"], ir.add(parent, one), ir.cast(end, index_type))]

    def allocate(self, parent_count, count, dim, idt, empty):
        # Uninitialized: the kernel's passes write every position they keep (the assemble
        # pass or the compute pass starts by emptying each segment).
        arrays = {"pos": empty((parent_count + 1,), idt), "crd": empty((count,), idt)}
        return arrays, count

    def trimmed(self, arrays, parent_count):
        pos = arrays["pos"][: parent_count + 1]
        return {"pos": pos, "crd": arrays["crd"][: int(pos[-1])]}

    def size(self, arrays, parent_count, dim):
        return int(arrays["pos"][-1])

    def check(self, where, arrays, dim, unique, state):
        pos, crd = arrays["pos"], arrays["crd"]
        n = checks.positions(where, pos, state.count)
        if len(crd) != n:
            raise FormatError(f"{where}: crd has length {len(crd)}, expected pos[-1] = {n}")
        checks.in_range(where, crd, dim)
        same = checks.same_segment(pos, n)
        if self.ordered:
            prev, cur = crd[:-1], crd[1:]
            bad = same & ((cur <= prev) if unique else (cur < prev))
            q = checks.first_true(bad)
            if q is not None:
                q += 1
                sorted_ = "strictly sorted" if unique else "sorted"
                raise FormatError(
                    f"{where}: crd not {sorted_} within segment of parent position "
                    f"{checks.parent_of(pos, q)} at position {q} (crd {int(crd[q])} after "
                    f"{int(crd[q - 1])})"
                )
        if not unique:
            state.run_level = state.level
            state.run_pos = pos
            state.run_eq = same & (crd[1:] == crd[:-1])
        state.count = n

    def pack(self, lvl, run_end, state):
        """A position per distinct (parent, coordinates of this level and the branchless
        levels below it that share its positions)."""
        lc, parent = state.lc, state.parent
        nnz = len(parent)
        flag = np.ones(nnz, dtype=bool)
        if nnz:
            flag[1:] = parent[1:] != parent[:-1]
            for j in range(lvl, run_end):
                flag[1:] |= lc[1:, j] != lc[:-1, j]
        first = np.flatnonzero(flag)
        n = len(first)
        pos = np.zeros(state.count + 1, dtype=state.idt)
        np.cumsum(np.bincount(parent[first], minlength=state.count), out=pos[1:])
        state.parent = np.cumsum(flag, dtype=np.int64) - 1
        state.first = first
        state.count = n
        return {"pos": pos, "crd": lc[first, lvl].astype(state.idt)}

    def unpack(self, arrays, dim, cols, count):
        pos = arrays["pos"]
        if cols:
            sizes = np.diff(pos)
            cols = [np.repeat(c, sizes) for c in cols]
        cols.append(arrays["crd"].astype(np.int64))
        return cols, len(arrays["crd"])


COMPRESSED = Compressed("C", "compressed", ("pos", "crd"), full=False, can_locate=False)


class Singleton(LevelKind):
    """Its parent is non-unique, so an output is computed compressed and converted."""

    coordinate_array = "crd"

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
        return COMPRESSED

    def searched(self):
        """Compressed: its parent then stores each coordinate once, and can be
        searched too."""
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
