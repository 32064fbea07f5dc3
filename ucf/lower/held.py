"""Stored values as numbers: the loads that widen what a format holds to the kernel's
type, and sums of integer products that are rescaled once per scale group.

A held value is loaded where the leaf reads it: a plain or half or bfloat16 value is
cast (the backends widen bfloat16 bits exactly), an int4 is cut from its byte with
shifts and sign-extended in int32, and a quantized ``q`` becomes
``scale[g] * (q - zero[g])`` for its scale group ``g``: the operand's position at the
format's scale level (``State.at``), or 0 for one scale per tensor.

When every factor of the product a sum adds is quantized and each factor's scale
group is fixed where the sum starts (per tensor; per row once the row is bound; per
block once the block is), the sum is of ``(q - zero)`` products in int32 and is
multiplied by the scales once, where it is stored or read: the accumulator of an
output entry, or a nested sum's temporary (``ucf.cin.scale_groups`` splits a sum
over blocks into ``sum_kb s(kb) * sum_kk q * q``). The number of terms such a sum
adds is checked per call (``Lowered.integer_sums``, ``ucf.format.quantize.check_sums``).
"""

from __future__ import annotations

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const
from ucf.lower.lattice import Negate, Op, Opnd, Term
from ucf.lower.state import Operand, State

I32 = "i32"


class HeldMixin:
    """Part of :class:`ucf.lower.lowerer.Lowerer`; see its docstring for the shared state."""

    def _held(self, op: Operand, index: ir.Expr, st: State) -> ir.Expr:
        """Operand ``op``'s value at position ``index`` in the kernel's type, or, in a
        sum of integer products (``st.integer``), its ``q - zero_point`` in int32."""
        values = op.fmt.values
        sp = op.params
        if values is None or not (values.packed or values.quantized):
            return ir.cast(ir.Load(sp.vals, index), self.vt)
        q = _nibble(sp.vals, index) if values.packed else ir.cast(ir.Load(sp.vals, index), I32)
        if not values.quantized:
            return ir.cast(q, self.vt)
        g = self._group(op, st)
        d = ir.sub(q, ir.Load(sp.zero, g))
        if st.integer:
            return d
        return ir.mul(ir.cast(d, self.vt), ir.cast(ir.Load(sp.scale, g), self.vt))

    def _group(self, op: Operand, st: State) -> ir.Expr:
        """The scale group of ``op``'s value read here."""
        level = op.fmt.values.level
        if level is None:
            return Const(0, I64)
        if op.dense:
            coords = [self._affine(ix) for ix in op.level_idx[: level + 1]]
            return self._dense_index(op.params, op.fmt, coords)
        return st.at[op.n, level]

    def _integer_factors(self, term: Term, st: State) -> list[Operand] | None:
        """The factors of ``term`` when it is a product of quantized operands whose scale
        groups are all fixed in ``st`` (so a sum below it can add integers), else None."""
        if self.vt not in ir.FLOAT_TYPES or st.ws is not None:
            return None
        found: list[Operand] = []

        def walk(t: Term) -> bool:
            if isinstance(t, Op) and t.op == "*":
                return walk(t.left) and walk(t.right)
            if isinstance(t, Negate):
                return walk(t.operand)
            if not isinstance(t, Opnd) or t.n not in self.operands:
                return False
            op = self.operands[t.n]
            values = op.fmt.values
            if t.n >= len(self.rhs_accesses) or not (values and values.quantized):
                return False
            found.append(op)
            return self._group_fixed(op, st)

        return found if walk(term) else None

    def _group_fixed(self, op: Operand, st: State) -> bool:
        level = op.fmt.values.level
        if level is None:
            return True
        if op.dense:
            bound = set(st.order[: st.depth])
            return all(set(ix.variables) <= bound for ix in op.level_idx[: level + 1])
        return (op.n, level) in st.at

    def _integer_sum(self, acc: ir.Var, factors: list[Operand], inner: State, st: State) -> ir.Expr:
        """Make ``inner`` (the walk below ``st`` that sums into ``acc``) add int32
        products; record the sum for the per-call overflow check, and return its value:
        ``acc`` times the scales of its factors' groups."""
        inner.integer = True
        if not self.assembling:
            slots = tuple(self.cin.slots[op.n].name for op in factors)
            loops = tuple(
                self.extents[v].value if isinstance(self.extents[v], Const) else v
                for v in inner.order[st.depth :]
            )
            self.integer_sums.append((slots, loops))
        value = ir.cast(acc, self.vt)
        for op in factors:
            value = ir.mul(value, ir.cast(ir.Load(op.params.scale, self._group(op, st)), self.vt))
        return value


def _nibble(vals: ir.Array, index: ir.Expr) -> ir.Expr:
    """The int4 at ``index``: the low nibble of byte ``index // 2`` for an even index,
    its high nibble for an odd one, sign-extended to int32."""
    byte = ir.cast(ir.Load(vals, ir.Bin(">>", index, Const(1, I64))), I32)
    shift = ir.cast(ir.mul(ir.Bin("&", index, Const(1, I64)), Const(4, I64)), I32)
    nib = ir.Bin("&", ir.Bin(">>", byte, shift), Const(15, I32))
    return ir.sub(nib, ir.Bin("<<", ir.Bin("&", nib, Const(8, I32)), Const(1, I32)))
