"""Coordinate-space split of a co-iterated loop."""

from __future__ import annotations

from ucf.errors import ScheduleError
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.schedule.commands import SplitCommand


class BlocksMixin:
    """Part of :class:`ucf.lower.lowerer.Lowerer`; see its docstring for the shared state."""

    def _narrow_to_blocks(self, v: str, iters: dict):
        """Narrow each co-iterated operand to the block ``[lo, hi)`` of a split of ``v``.

        A loop that co-iterates several sparse operands has no dense range to
        strip-mine, so the split happens in coordinate space, as in TACO: the
        outer loop runs over blocks of coordinates and every operand is narrowed
        to the block by two binary searches.  Blocks share no state, so the outer
        loop may run in parallel.
        """
        cmd = self.splits[v]
        for it in iters.values():
            if it.stride != 1 or it.offset is not None or not it.kind.ordered:
                raise ScheduleError(
                    f"{cmd}: {v} co-iterates an operand whose level cannot be searched by "
                    "coordinate (an affine window or an unordered level); split a dense or "
                    "singly-driven loop instead"
                )
        inner = cmd.inner
        lo, hi = Var(f"{inner}_lo", I64), Var(f"{inner}_hi", I64)
        for it in iters.values():
            pb, pe = Var(f"{it.pos.name}_seg", I64), Var(f"{it.end.name}_seg", I64)
            wb, we = Var(f"{it.pos.name}_w0", I64), Var(f"{it.pos.name}_w1", I64)
            it.init = [
                ir.Decl(pb, it.begin),
                ir.Decl(pe, it.end_expr),
                ir.Decl(wb, pb),
                *it.kind.search(it.arrays, pb, pe, lo, wb),
                ir.Decl(we, wb),
                *it.kind.search(it.arrays, wb, pe, hi, we),
                ir.Decl(it.pos, wb),
                ir.Decl(it.end, we),
            ]
        self.consumed.add(cmd)
        return cmd

    def _blocks(self, cmd: SplitCommand, stmts: list[ir.Stmt]) -> list[ir.Stmt]:
        """The co-iteration ``stmts`` inside a loop over blocks of coordinates."""
        v, outer, inner, amount = cmd.var, cmd.outer, cmd.inner, cmd.amount
        n = self._loop_end(v)
        lo, hi = Var(f"{inner}_lo", I64), Var(f"{inner}_hi", I64)
        prelude: list[ir.Stmt] = []
        if cmd.mode == "split":
            chunk: ir.Expr = Const(amount, I64)
            blocks = ir.Bin("/", ir.add(n, Const(amount - 1, I64)), chunk)
        else:
            chunk = Var(f"{inner}_chunk", I64)
            parts = Const(amount, I64)
            prelude.append(
                ir.Decl(chunk, ir.Bin("/", ir.sub(ir.add(n, parts), Const(1, I64)), parts))
            )
            blocks = parts
        o = Var(outer, I64)
        body = [
            ir.Decl(lo, ir.mul(o, chunk)),
            ir.Decl(hi, ir.minimum(ir.add(ir.mul(o, chunk), chunk), n)),
            *stmts,
        ]
        return [*prelude, ir.For(o, Const(0, I64), blocks, body, label=outer)]
