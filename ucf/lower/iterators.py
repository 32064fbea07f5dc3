"""Walking one operand's levels: position ranges, coordinates, locate."""

from __future__ import annotations

from ucf.errors import UnsupportedError
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.lower.state import (
    Iterator,
    State,
)


class IteratorsMixin:
    """Part of :class:`ucf.lower.lowerer.Lowerer`; see its docstring for the shared state."""

    def _sparse_here(self, v: str, st: State):
        """Operands whose next level is indexed by v, split into sparse and located ones."""
        sparse, located = [], []
        for n, op in self.operands.items():
            if op.dense or st.levels[n] >= op.fmt.order:
                continue
            lvl = st.levels[n]
            if op.level_vars[lvl] != v:
                continue
            (located if op.fmt.levels[lvl].can_locate else sparse).append(n)
        return sparse, located

    def _bounds(self, n: int, st: State) -> tuple[ir.Expr, ir.Expr]:
        """The position range of operand ``n``'s next level; empty when the operand did
        not match above (its parent position is then not its own)."""
        op = self.operands[n]
        lvl = st.levels[n]
        begin, end = op.fmt.levels[lvl].bounds(
            op.params.levels[lvl], st.pos[n], st.seg_end.get(n), op.dim(lvl)
        )
        alive = st.alive.get(n)
        if alive is None:
            return begin, end
        return ir.Select(alive, begin, ir.const_like(begin, 0)), ir.Select(
            alive, end, ir.const_like(end, 0)
        )

    def _iterator(self, n: int, v: str, st: State) -> Iterator:
        op = self.operands[n]
        lvl = st.levels[n]
        kind = op.fmt.levels[lvl]
        arrays = op.params.levels[lvl]
        base = f"{op.name}{lvl}"
        begin, end = self._bounds(n, st)
        p = Var(f"p{base}", I64)
        if n in self.cin.slots and self.pos_map.get(v, ("", ""))[1] == self.cin.slots[n].tensor:
            p = Var(self.pos_map[v][0], I64)
        e = Var(f"p{base}_end", I64)
        it = Iterator(n, p, e, Var(f"{v}{op.name}", I64), kind, arrays, unique=op.fmt.unique(lvl))
        it.begin, it.end_expr = ir.cast(begin, I64), ir.cast(end, I64)
        if op.affine(lvl):
            a = op.level_idx[lvl]
            access = self.rhs_accesses[n] if n < len(self.rhs_accesses) else a
            if not (it.unique and kind.ordered) or kind.branchless:
                raise UnsupportedError(
                    f"access {access}: affine index '{a}' on a {kind.name} level that is not "
                    "unique and ordered; store that level compressed (C) below unique levels, "
                    "or dense (U)"
                )
            if a.coefficient(v) < 0:
                raise UnsupportedError(
                    f"access {access}: affine index '{a}' on a compressed level decreases with "
                    f"{v}, its innermost loop; store that level dense (U) or reorder the loops"
                )
            self._window(it, lvl, v, it.begin, it.end_expr, st)
        it.init = [*it.setup, ir.Decl(p, it.begin), ir.Decl(e, it.end_expr)]
        if it.stride > 1:
            it.skip = [
                ir.While(
                    ir.land(ir.Cmp("<", p, e), self._on_stride(it, False)),
                    [ir.Assign(p, ir.add(p, Const(1, I64)))],
                )
            ]
            it.init += it.skip
        if not it.unique:
            it.seg = Var(f"p{base}_seg", I64)
        return it

    def _coordinate_stmts(self, it: Iterator) -> list[ir.Stmt]:
        stmts: list[ir.Stmt] = [ir.Decl(it.coord, self._it_coord(it))]
        if not it.unique:
            nxt = ir.add(it.seg, Const(1, I64))
            same = ir.land(
                ir.Cmp("<", it.seg, it.end),
                ir.Cmp("==", ir.cast(it.kind.coordinate(it.arrays, it.seg), I64), it.coord),
            )
            stmts += [
                ir.Decl(it.seg, ir.add(it.pos, Const(1, I64))),
                ir.While(same, [ir.Assign(it.seg, nxt)]),
            ]
        return stmts

    def _advance(self, it: Iterator) -> ir.Expr:
        return it.seg if not it.unique else ir.add(it.pos, Const(1, I64))

    def _locate(self, n: int, st: State, inner: State) -> ir.Stmt:
        """Find operand ``n``'s position in its next (dense) level; an affine coordinate
        out of range is excluded by the loop's guard before the position is used."""
        op = self.operands[n]
        lvl = st.levels[n]
        p = Var(f"p{op.name}{lvl}", I64)
        coord = self._affine(op.level_idx[lvl])
        decl = ir.Decl(p, op.fmt.levels[lvl].locate(st.pos[n], coord, op.dim(lvl)))
        inner.levels[n] = lvl + 1
        inner.pos[n] = p
        inner.at[n, lvl] = p
        inner.seg_end[n] = None
        return decl

    @staticmethod
    def _past_offset(it: Iterator) -> ir.Expr:
        """The stored coordinate minus an affine index's offset: ``stride * v``."""
        c = ir.cast(it.kind.coordinate(it.arrays, it.pos), I64)
        return c if it.offset is None else ir.sub(c, it.offset)

    def _it_coord(self, it: Iterator) -> ir.Expr:
        """The iterator's coordinate in its loop's variable (undoing an affine index)."""
        c = self._past_offset(it)
        return c if it.stride == 1 else ir.Bin("/", c, Const(it.stride, I64))

    def _on_stride(self, it: Iterator, on: bool = True) -> ir.Expr:
        rem = ir.Bin("%", self._past_offset(it), Const(it.stride, I64))
        return ir.Cmp("==" if on else "!=", rem, Const(0, I64))
