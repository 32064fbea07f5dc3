"""The output: dense stores, and appends to a sparse output's levels."""

from __future__ import annotations

from ucf.format.format import Format
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.lower.lattice import Term, reduces
from ucf.lower.state import (
    SlotParams,
    State,
)


class AssemblyMixin:
    """Part of :class:`ucf.lower.lowerer.Lowerer`; see its docstring for the shared state."""

    def _local_level(self) -> int | None:
        """The one compressed output level below only dense ones, if that is the shape.

        Such an output (CSR and its kin) is counted per segment, so each
        segment's positions are known before the compute pass and its dense
        loops can run in parallel.
        """
        if not self.sparse_out:
            return None
        sparse = [k for k, lvl in enumerate(self.out_fmt.levels) if not lvl.full]
        if len(sparse) == 1 and self.out_fmt.levels[sparse[0]].letter == "C":
            return sparse[0]
        return None

    def _out_kind(self, v: str, st: State) -> str | None:
        if not self.sparse_out or st.out_level >= self.out_fmt.order:
            return None
        if self.out_level_vars[st.out_level] != v:
            return None
        return self.out_fmt.levels[st.out_level].letter

    def _accumulate(self, term: Term, st: State) -> list[ir.Stmt]:
        """The rest of the nest summed into a scalar, stored once every output variable is
        bound; for an append deferred past a reduction (``st.pending``), the entry is
        appended only if some term of the reduction was present, so the output's
        pattern is exactly the implied one."""
        acc = Var(f"t{next(self._fresh)}", self.vt)
        inner = st.copy()
        inner.acc = acc
        if st.pending is None:
            return [
                ir.Decl(acc, Const(0, self.vt)),
                *self._nest(term, inner),
                self._store_output(st, acc),
            ]
        hit = Var(f"{acc.name}_hit", "i1")
        inner.hit = hit
        lvl, coord = st.pending
        q = Var(f"p{self.out_name}{lvl}", I64)
        counter = self._counter(st, lvl)
        insert: list[ir.Stmt] = [ir.Decl(q, counter)]
        if not self.assembling:
            crd = self.out_params.levels[lvl]["crd"]
            insert += [
                ir.Store(crd, q, ir.cast(coord, self.it)),
                ir.Store(self.out_params.vals, q, acc),
            ]
        insert.append(ir.Assign(counter, ir.add(counter, Const(1, I64))))
        return [
            ir.Decl(acc, Const(0, self.vt)),
            ir.Decl(hit, Const(False, "i1")),
            *self._nest(term, inner),
            ir.If(hit, insert),
        ]

    def _output_level(self, term: Term, st: State, inner: State, coord: Var) -> list[ir.Stmt]:
        """Place the coordinate of loop ``coord`` in the output level it indexes: locate it
        in a dense level, append it to a compressed one, or defer the append (setting
        ``inner.pending``) until the reduction or nested sum below has met an entry."""
        lvl = st.out_level
        inner.out_level += 1
        kind = self.out_fmt.levels[lvl]
        dim = self.out_params.dims[self.out_fmt.mode_order[lvl]]
        q = Var(f"p{self.out_name}{lvl}", I64)
        last = lvl == self.out_fmt.order - 1
        if kind.full:
            inner.out_pos = q
            return [ir.Decl(q, kind.locate(st.out_pos, coord, dim))]
        if last and (inner.depth < len(inner.order) or reduces(term)):
            inner.pending = (lvl, coord)
            return []
        counter = self._counter(st, lvl)
        stmts: list[ir.Stmt] = [ir.Decl(q, counter)]
        if not self.assembling:
            stmts.append(ir.Store(self.out_params.levels[lvl]["crd"], q, ir.cast(coord, self.it)))
        stmts.append(ir.Assign(counter, ir.add(counter, Const(1, I64))))
        inner.out_pos = q
        return stmts

    def _counter(self, st: State, lvl: int) -> Var:
        if lvl == self.local and st.counter is not None:
            return st.counter
        return self.counters[lvl]

    def _store_output(self, st: State, value: ir.Expr) -> ir.Stmt:
        # Each output position is reached exactly once when only output variables
        # enclose the store (lattice loops partition the coordinates), so `=`
        # statements can overwrite instead of read-modify-write.
        outer = st.order[: st.depth]
        once = (
            self.cin.statement.op == "="
            and all(v in self.out_vars for v in outer)
            and not self.repeats
        )
        if self.sparse_out:
            index = st.out_pos
        else:
            coords = [Var(v, I64) for v in self.out_level_vars]
            index = self._dense_index(self.out_params, self.out_fmt, coords)
        return ir.Store(self.out_params.vals, index, value, accumulate=not once)

    def _dense_index(self, sp: SlotParams, fmt: Format, coords: list[ir.Expr]) -> ir.Expr:
        index: ir.Expr = Const(0, I64)
        for lvl, c in enumerate(coords):
            index = ir.add(ir.mul(index, sp.dims[fmt.mode_order[lvl]]), c)
        return index
