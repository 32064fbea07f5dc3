"""Affine indices: sliding windows over compressed levels, guards on dense ones."""

from __future__ import annotations

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.lang.affine import Affine
from ucf.lower.state import (
    Iterator,
    State,
)


class WindowsMixin:
    """Part of :class:`ucf.lower.lowerer.Lowerer`; see its docstring for the shared state."""

    def _cursors(self, u: str, st: State, used: set[int]) -> tuple[State, list[ir.Stmt]]:
        """Cursors for the affine windows that slide forward as ``u`` advances.

        When ``u`` is the innermost variable of a compressed level's window
        offset and that level's parent is fixed across the loop over ``u``,
        each window starts (and ends) at or after the previous one, so its
        search resumes from there: a linear scan whose total over the loop is
        the segment's length.  Only when ``u`` runs serially in increasing
        order, as in an untransformed loop nest.
        """
        if self.applied is not None and (
            self.applied.provenance.rel
            or any(u in self.applied.provenance.origins(p) for p in self.applied.parallel)
        ):
            return st, []
        # A where's side keeps only its own loops: a variable it does not hold is bound
        # around it, before all of them.
        position = {v: k for k, v in enumerate(st.order)}
        decls: list[ir.Stmt] = []
        cursors = dict(st.cursors)
        for n, op in self.operands.items():
            lvl = st.levels[n]
            if n not in used or op.dense or lvl >= op.fmt.order or not op.affine(lvl):
                continue
            a = op.level_idx[lvl]
            rest = a.without(op.level_vars[lvl])
            kind = op.fmt.levels[lvl]
            if (
                not rest.variables
                or rest.base(dict.fromkeys(rest.variables, -1) | position) != u
                or rest.coefficient(u) <= 0
                or kind.full
                or not op.fmt.unique(lvl)
            ):
                continue
            begin, _ = self._bounds(n, st)
            pair = tuple(Var(f"{op.name}{lvl}_{u}_cursor{k}", I64) for k in range(2))
            decls += [ir.Decl(c, ir.cast(begin, I64)) for c in pair]
            cursors[(n, lvl)] = pair
        if decls:
            st = st.copy()
            st.cursors = cursors
        return st, decls

    def _guards(self, v: str, st: State, used: set[int], located: list[int]) -> dict:
        """Operands read through a located level whose affine index has base ``v``.

        Such a coordinate can fall outside the level, where the operand reads
        as zero (implicit padding): at ``v`` the operand may be absent, like a
        sparse one, and its guard says where it is present.
        """
        guards: dict[int, list[tuple[Affine, ir.Expr]]] = {}
        for n, op in self.operands.items():
            if n not in used:
                continue
            if op.dense:
                levels = [k for k, b in enumerate(op.level_vars) if b == v and op.affine(k)]
            elif n in located and op.affine(st.levels[n]):
                levels = [st.levels[n]]
            else:
                continue
            if levels:
                guards[n] = [(op.level_idx[k], op.dim(k)) for k in levels]
        return guards

    def _guard_flags(self, guards: dict, which) -> dict[int, ir.Decl]:
        flags = {}
        for n, conds in guards.items():
            if n not in which:
                continue
            ok: ir.Expr = Const(True, "i1")
            for a, dim in conds:
                c = self._affine(a)
                ok = ir.land(ok, ir.land(ir.Cmp(">=", c, Const(0, I64)), ir.Cmp("<", c, dim)))
            var = Var(f"{self.operands[n].name}_in{next(self._fresh)}", "i1")
            flags[n] = ir.Decl(var, ok)
        return flags

    def _guard_range(self, v: str, conds: list) -> tuple[ir.Expr, ir.Expr]:
        """The values of ``v`` for which every guard holds: ``s*v + off`` in [0, dim)."""
        lo: ir.Expr = Const(0, I64)
        hi: ir.Expr = self._loop_end(v)
        for a, dim in conds:
            s = a.coefficient(v)
            off = self._affine(a.without(v))
            if s > 0:
                first = ceildiv(ir.Neg(off), s)
                end = ceildiv(ir.sub(dim, off), s)
            else:
                first = ir.add(floordiv(ir.sub(off, dim), -s), Const(1, I64))
                end = ir.add(floordiv(off, -s), Const(1, I64))
            lo = ir.Bin("max", lo, first)
            hi = ir.minimum(hi, end)
        return lo, hi

    def _window(
        self, it: Iterator, lvl: int, v: str, begin: ir.Expr, end: ir.Expr, st: State
    ) -> None:
        """Iterate only the positions of a compressed level whose coordinates lie in the
        window ``[off, off + s*|v|)`` of the index ``s*v + off``.

        Each end is found by binary search, unless the window's interval over
        the loops around it shows that end is always outside the stored
        range; that test only reads extents, so it is decided once per call.
        """
        op = self.operands[it.n]
        a = op.level_idx[lvl]
        s = a.coefficient(v)
        rest = a.without(v)
        off = self._affine(rest)
        low, high = (self._affine(b) for b in rest.interval(lambda u: f"n_{u}"))
        span = ir.mul(Const(s, I64), self.extents[v])  # the window's width
        lo_key, hi_key = off, ir.add(off, span)
        dim = op.dim(lvl)
        pb, pe = Var(f"{it.pos.name}_seg", I64), Var(f"{it.end.name}_seg", I64)
        wb, we = Var(f"{it.pos.name}_w0", I64), Var(f"{it.pos.name}_w1", I64)
        setup: list[ir.Stmt] = [ir.Decl(pb, begin), ir.Decl(pe, end)]
        if (it.n, lvl) in st.cursors:
            pair = st.cursors[(it.n, lvl)]
            for w, key, cur in zip((wb, we), (lo_key, hi_key), pair, strict=True):
                crd = ir.cast(it.kind.coordinate(it.arrays, cur), I64)
                step = ir.Assign(cur, ir.add(cur, Const(1, I64)))
                setup += [
                    ir.While(ir.land(ir.Cmp("<", cur, pe), ir.Cmp("<", crd, key)), [step]),
                    ir.Decl(w, cur),
                ]
        else:
            reach = ir.add(low, span)
            # (result, key, search from, value when no search is needed, "search needed")
            for w, key, first, outside, needed in (
                (wb, lo_key, pb, pb, ir.Cmp(">", high, Const(0, I64))),
                (we, hi_key, wb, pe, ir.Cmp("<", reach, dim)),
            ):
                search = it.kind.search(it.arrays, first, pe, key, w)
                setup += [ir.Decl(w, outside), ir.If(needed, search)]
        it.setup = setup
        it.begin, it.end_expr = wb, we
        it.stride, it.offset = s, off


def floordiv(a: ir.Expr, d: int) -> ir.Expr:
    """Division rounding down, for a positive constant divisor (LLIR's ``/`` truncates)."""
    if d == 1:
        return a
    k = Const(d, I64)
    rem = ir.Bin("%", ir.add(ir.Bin("%", a, k), k), k)
    return ir.Bin("/", ir.sub(a, rem), k)


def ceildiv(a: ir.Expr, d: int) -> ir.Expr:
    return a if d == 1 else ir.Neg(floordiv(ir.Neg(a), d))
