"""Nested sums computed into scalar temporaries where their variables are fixed."""

from __future__ import annotations

from ucf.ir import nodes as ir
from ucf.ir.nodes import Const, Var
from ucf.lang import algebra
from ucf.lower.lattice import (
    Reduce,
    Temp,
    Term,
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
            stmts.append(ir.Decl(t, _identity(r.op, t.type)))
            if hit is not None:
                stmts.append(ir.Decl(hit, Const(False, "i1")))
            stmts += self._nest(r.body, sub)
            term = substitute(term, r.id, Temp(r.id, r.op))
        if not track:
            return stmts + self._nest(term, st)
        return stmts + self._present(term, st, [r.id for r in ready])

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
