"""The value of the right-hand side where the innermost loop computes it: an operand's
stored or dense value (its fill where it is absent), a workspace's, a literal, a nested
sum's temporary, and the operations between them.

Part of :class:`ucf.lower.lowerer.Lowerer` (see its docstring for the shared state),
split out of it as the leaf's arithmetic, apart from the descent that reaches the
leaf; the windows, iterators and held values read an index's value here too
(``_affine``).
"""

from __future__ import annotations

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.lang.affine import Affine
from ucf.lower import elementwise
from ucf.lower.lattice import Func, Lit, Negate, Op, Opnd, Temp, Term
from ucf.lower.state import State


class LeafValuesMixin:
    """Part of :class:`ucf.lower.lowerer.Lowerer`; see its docstring for the shared state."""

    def _fill(self, n: int) -> float:
        """The value operand ``n`` reads as where it is absent (a workspace: 0)."""
        slot = self.cin.slots.get(n)
        return slot.format.fill if slot is not None else 0.0

    @staticmethod
    def _affine(a: Affine) -> ir.Expr:
        """An index's value from the loop variables that are bound where it is read."""
        e: ir.Expr = Const(a.const, I64)
        for v, c in a.terms:
            e = ir.add(e, ir.mul(Const(c, I64), Var(v, I64)))
        return e

    def _value(self, t: Term, st: State) -> ir.Expr:
        if isinstance(t, Opnd):
            op = self.operands[t.n]
            alive = st.alive.get(t.n)
            if t.n >= len(self.rhs_accesses):
                ws = self.wheres[t.n - len(self.rhs_accesses)].ws
                value = ir.Load(ws.vals, ws.index)
                # in a flat loop an unmatched workspace holds an earlier row's value
                # (it is reset only where this row writes it): it reads as 0 there
                return value if alive is None else ir.Select(alive, value, Const(0, value.type))
            if op.dense:
                coords = [self._affine(ix) for ix in op.level_idx]
                value = self._held(op, self._dense_index(op.params, op.fmt, coords), st)
            else:
                value = self._held(op, st.pos[t.n], st)
            if alive is None:
                return value
            fill = self._fill(t.n)
            absent = ir.cast(Const(fill, "f64"), value.type) if fill else Const(0, value.type)
            return ir.Select(alive, value, absent)
        if isinstance(t, Lit):
            return ir.cast(Const(t.value, "f64" if isinstance(t.value, float) else I64), self.vt)
        if isinstance(t, Negate):
            return ir.Neg(self._value(t.operand, st))
        if isinstance(t, Temp):
            return self.rescaled.get(t.id, self.temps[t.id])
        if isinstance(t, Func):
            return elementwise.apply(t.fn, [self._value(a, st) for a in t.args])
        assert isinstance(t, Op), f"{t} reached a leaf uncomputed"
        return ir.Bin(t.op, self._value(t.left, st), self._value(t.right, st))
