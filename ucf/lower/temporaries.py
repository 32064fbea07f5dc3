"""Nested sums computed into scalar temporaries where their variables are fixed."""

from __future__ import annotations

import math

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.lang import algebra
from ucf.lower.lattice import (
    Reduce,
    Temp,
    Term,
    folded,
    operands,
    reduces,
    restrict,
    substitute,
)
from ucf.lower.state import (
    State,
)


class TemporariesMixin:
    """Part of :class:`ucf.lower.lowerer.Lowerer`; see its docstring for the shared state."""

    def _free(self, r: Reduce) -> set[str]:
        """The variables a nested sum's value depends on."""
        used = {
            v
            for n in operands(r.body)
            for idx in self.rhs_accesses[n].indices
            for v in idx.variables
        }
        return used - {v for x in reduces(r) for v in x.vars}

    def _temporaries(self, term: Term, st: State, ready: list[Reduce]) -> list[ir.Stmt]:
        """Compute nested sums into temporaries, then go on with them in their place.

        Each temporary gets a loop nest of its own over its sum's variables,
        started from where the walk down the operands has got to, so it is
        computed once per value of the variables it depends on (hoisted out of
        any loop it does not depend on).  When the output is sparse, whether
        anything was summed decides the pattern: where a sum met no stored
        entry, the expression continues as if the sum were absent.
        """
        stmts: list[ir.Stmt] = []
        track = self.sparse_out
        for r in ready:
            t = self.temps[r.id]
            hit = Var(f"{t.name}_hit", "i1") if track else None
            sub = st.copy()
            own = tuple(v for v in self.cin.order if v in r.vars)
            sub.order = st.order[: st.depth] + own
            factors = self._integer_factors(r.body, st) if r.op == "sum" else None
            if factors is not None:  # an int32 sum, read rescaled (``ucf.lower.held``)
                t = Var(f"{t.name}_q", "i32")
                self.rescaled[r.id] = self._integer_sum(t, factors, sub, st)
            sub.acc, sub.hit, sub.pending, sub.temp = t, hit, None, True
            sub.acc_op, sub.target = r.op, algebra.IDENTITY[r.op]
            skipped = self._skipping(r, st, own, t.type)
            sub.visits = None if skipped is None else Var(f"{t.name}_seen", I64)
            stmts.append(ir.Decl(t, _identity(r.op, t.type)))
            if hit is not None:
                stmts.append(ir.Decl(hit, Const(False, "i1")))
            if skipped is not None:
                sub.target = skipped.value
                stmts.append(ir.Decl(sub.visits, Const(0, I64)))
            stmts += self._nest(r.body, sub)
            if skipped is not None:
                stmts.append(self._fold_skipped(r, own, t, hit, sub.visits, skipped))
            term = substitute(term, r.id, Temp(r.id, r.op))
        if not track:
            return stmts + self._nest(term, st)
        return stmts + self._present(term, st, [r.id for r in ready])

    def _skipping(self, r: Reduce, st: State, own: tuple[str, ...], ty: str) -> Const | None:
        """The value of the coordinates a max or min may skip, where that is a constant
        other than its identity (``max(j, A(i,j))`` over a ``csr`` row: 0), else None.

        A max or min is idempotent: the coordinates it skips, all holding the same ``c``,
        change its value exactly as much as one of them does. So its loops take ``c`` as
        their target (``ucf.lower.lattice``: they skip where the body folds to ``c``),
        count the coordinates they combine, and fold ``c`` in once when that count is
        less than the reduced extent (``_fold_skipped``), as scipy's ``max(axis=...)``
        does. Sums (whose value depends on how many are skipped) never get here. Loops
        whose coordinates are not each combined once within the extents (blocks, a
        repeated variable's offset, fused loops, a precompute's workspaces,
        affine indices), and loops a schedule bounds (``bound`` needs a dense loop),
        keep visiting every coordinate."""
        if r.op == "sum" or st.ws is not None or self.wheres:
            return None
        special = {v for inner, (_, outer, _) in self.cin.blocks.items() for v in (inner, outer)}
        special |= set(self.cin.diagonals) | set(self.fused)
        special |= {b.origin for b in self.cin.bounds.values()}  # a bound loop is dense
        if special & set(own):
            return None
        absent = set()
        for n in operands(r.body):
            op = self.operands[n]
            if any(op.affine(lvl) for lvl in range(op.fmt.order)):
                return None
            levels = zip(op.level_vars, op.fmt.levels, strict=True)
            if any(v in own and not level.full for v, level in levels):
                absent.add(n)
        c = folded(r.body, absent, self._fill)
        if c is None or math.isnan(c) or algebra.same(c, algebra.IDENTITY[r.op]):
            return None
        if ty in ir.FLOAT_TYPES:
            return Const(c, ty)
        return Const(int(c), ty) if c.is_integer() else None

    def _fold_skipped(
        self, r: Reduce, own: tuple[str, ...], t: Var, hit: Var | None, seen: Var, c: Const
    ) -> ir.Stmt:
        """Where the loops over ``own`` combined fewer coordinates than they span, the
        skipped ones' value ``c`` once: combined as the leaf combines a value (the new
        value first, so the NaN rule of ``_leaf`` holds)."""
        extent: ir.Expr = Const(1, I64)
        for v in own:
            extent = ir.mul(extent, self.extents[v])
        fold: list[ir.Stmt] = [ir.Assign(t, ir.Bin(r.op, c, t))]
        if hit is not None:
            fold.append(ir.Assign(hit, Const(True, "i1")))
        return ir.If(ir.Cmp("<", seen, extent), fold)

    def _present(self, term: Term | None, st: State, ids: list[int]) -> list[ir.Stmt]:
        """The rest of the nest with each temporary in ``ids`` present where its sum met a
        stored entry, and absent where it did not."""
        if term is None:
            return []
        if not ids:
            return self._nest(term, st)
        k, rest = ids[0], ids[1:]
        hit = Var(f"{self.temps[k].name}_hit", "i1")
        absent = restrict(term, {Temp(k).n}, self._fill, st.target)
        return [ir.If(hit, self._present(term, st, rest), self._present(absent, st, rest))]


def _identity(op: str, ty: str) -> Const:
    """A reduction's starting value in type ``ty``: 0, or the extreme the type holds."""
    if ty in ir.FLOAT_TYPES:
        return Const(algebra.IDENTITY[op] if op != "sum" else 0, ty)
    return Const(algebra.integer_identity(op, int(ty[1:])), ty)
