"""pos over fused levels: one loop over a tensor's nonzeros across several levels."""

from __future__ import annotations

from ucf.errors import ScheduleError
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Var
from ucf.lower.lattice import (
    Term,
    lattice,
    operands,
    why_full,
)
from ucf.lower.state import (
    State,
)


class FusedMixin:
    """Part of :class:`ucf.lower.lowerer.Lowerer`; see its docstring for the shared state."""

    def _fused_loop(self, term: Term, st: State, fvars: tuple, label: str, tensor: str):
        """One loop over the positions of ``tensor``'s deepest fused level.

        Each iteration recovers the parent positions and coordinates above it.
        A compressed parent is found by binary search at the start of a range
        (the loop's start, or each block's once it is split) and then advanced
        incrementally, so a block costs one search plus constant work per
        nonzero.
        """
        cmd = f"pos over {', '.join(fvars)} ({label}, {tensor})"
        used = operands(term)
        n = next(
            (
                x
                for x, op in self.operands.items()
                if x in self.cin.slots
                and self.cin.slots[x].tensor == tensor
                and x in used
                and not op.dense
                and st.levels[x] < op.fmt.order
                and op.level_vars[st.levels[x]] == fvars[0]
            ),
            None,
        )
        if n is None:
            raise ScheduleError(f"{cmd}: {tensor} does not drive the loop over {fvars[0]} here")
        op = self.operands[n]
        a = st.levels[n]
        m = len(fvars)
        b = a + m - 1
        if op.level_vars[a : b + 1] != list(fvars):
            raise ScheduleError(f"{cmd}: {tensor} does not store {', '.join(fvars)} in that order")
        affine = [str(op.level_idx[k]) for k in range(a, b + 1) if op.affine(k)]
        if affine:
            raise ScheduleError(
                f"{cmd}: {tensor}'s index '{affine[0]}' is affine; pos over fused levels needs "
                "plain indices"
            )
        if self.sparse_out:
            raise ScheduleError(
                f"{cmd}: a sparse output cannot be appended from a loop over fused nonzeros"
            )
        if lattice(term, lambda x: x == n, self._fill, st.target)[0].full:
            raise ScheduleError(
                f"{cmd}: the loop over {fvars[0]} also visits coordinates where {tensor} is zero "
                f"({why_full(term, self._fill, st.target)})"
            )
        cur = st.copy()
        located_stmts: list[ir.Stmt] = []
        for v in fvars:
            sparse, located = self._sparse_here(v, cur)
            others = [x for x in sparse if x in used and x != n]
            if others:
                names = ", ".join(self.cin.slots[x].tensor for x in others)
                raise ScheduleError(
                    f"{cmd}: {v} also co-iterates {names}; pos needs {tensor} alone"
                )
            for x in located:
                if x != n:  # the fused loop walks its own tensor's levels itself
                    located_stmts.append(self._locate(x, cur, cur))
            cur.levels[n] += 1
        arrays = op.params.levels
        kinds = op.fmt.levels
        dims = [op.params.dims[op.fmt.mode_order[lvl]] for lvl in range(op.fmt.order)]
        self.repeats = self.repeats or not op.fmt.unique(b)
        pre: list[ir.Stmt] = []
        ranges: dict[int, tuple[Var, Var]] = {}
        lo, hi = kinds[a].bounds(arrays[a], st.pos[n], st.seg_end.get(n), dims[a])
        for lvl in range(a, b + 1):
            if lvl > a:
                lo, hi = kinds[lvl].child_range(arrays[lvl], *ranges[lvl - 1], dims[lvl])
            rng = (Var(f"{label}_lo{lvl}", I64), Var(f"{label}_hi{lvl}", I64))
            pre += [ir.Decl(rng[0], ir.cast(lo, I64)), ir.Decl(rng[1], ir.cast(hi, I64))]
            ranges[lvl] = rng
        p = Var(label, I64)
        first = Var(f"{label}_first", I64)
        entry: list[ir.Stmt] = []
        body: list[ir.Stmt] = []
        parents: dict[int, ir.Expr] = {b: p}
        child, child_first = p, first
        for lvl in range(b, a, -1):
            q = Var(f"{label}_q{lvl - 1}", I64)
            found, step, child_first = kinds[lvl].parent_walk(
                arrays[lvl], dims[lvl], child, child_first, ranges[lvl - 1], q
            )
            entry += found
            body += step
            parents[lvl - 1] = q
            child = q
        for lvl in range(a, b + 1):
            parent = st.pos[n] if lvl == a else parents[lvl - 1]
            coord = kinds[lvl].coordinate(arrays[lvl], parents[lvl], parent, dims[lvl])
            body.append(ir.Decl(Var(fvars[lvl - a], I64), ir.cast(coord, I64)))
        body += located_stmts
        inner = cur
        inner.depth = st.depth + m
        inner.pos[n] = p
        inner.at.update({(n, lvl): parents[lvl] for lvl in range(a, b + 1)})
        inner.seg_end[n] = None
        body += self._at_depth(term, inner)
        loop = ir.For(p, ranges[b][0], ranges[b][1], body, label=label)
        self.entries[label] = (first, len(entry) + 1)
        return [*pre, ir.Decl(first, ranges[b][0]), *entry, loop]
