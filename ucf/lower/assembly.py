"""The output: dense stores, and appends to a sparse output's levels."""

from __future__ import annotations

from ucf.format.format import Format
from ucf.ir import nodes as ir
from ucf.ir.nodes import Const, Var
from ucf.lower.state import (
    SlotParams,
    State,
)

I64 = "i64"


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
