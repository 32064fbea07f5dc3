"""Coordinate-space splits of a co-iterated loop, and splits of their blocks."""

from __future__ import annotations

from ucf.errors import ScheduleError
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.schedule.commands import SplitCommand


class BlocksMixin:
    """Part of :class:`ucf.lower.lowerer.Lowerer`; see its docstring for the shared state."""

    def _narrow_to_blocks(self, v: str, iters: dict) -> list[SplitCommand]:
        """Narrow each co-iterated operand to the innermost block ``[lo, hi)`` of the
        splits of ``v``: ``split(v, v0, v1, f)``, then any split of the block ``v1``, and
        so on (TACO's ``split(i,iX,iY,4); split(iY,iY1,iY2,2)``).

        A loop that co-iterates several sparse operands has no dense range to
        strip-mine, so the split happens in coordinate space, as in TACO: the
        outer loop runs over blocks of coordinates, a split of the block over smaller
        blocks inside it, and every operand is narrowed to the innermost block by two
        binary searches. Blocks share no state, so their loops may run in parallel,
        and since each loop's trip count is fixed by the split factors (a block past
        the end of the one around it is empty), they may be reordered.
        """
        chain = [self.splits[v]]
        while chain[-1].inner in self.splits:
            chain.append(self.splits[chain[-1].inner])
        for it in iters.values():
            if it.stride != 1 or it.offset is not None or not it.kind.ordered:
                raise ScheduleError(
                    f"{chain[0]}: {v} co-iterates an operand whose level cannot be searched "
                    "by coordinate (an affine window or an unordered level); split a dense or "
                    "singly-driven loop instead"
                )
        inner = chain[-1].inner
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
        self.consumed.update(chain)
        return chain

    def _blocks(self, chain: list[SplitCommand], stmts: list[ir.Stmt]) -> list[ir.Stmt]:
        """The co-iteration ``stmts`` inside loops over blocks of coordinates, one per
        split of ``chain``, the first over the whole range of its variable."""
        prelude: list[ir.Stmt] = []
        levels = []  # per split: its loop variable, block size, trip count, lo and hi
        lo_up: ir.Expr = Const(0, I64)
        hi_up: ir.Expr = self._loop_end(chain[0].var)
        size_up: ir.Expr | None = None  # the block size of the split around, if any
        for cmd in chain:
            outer, inner, amount = cmd.outer, cmd.inner, cmd.amount
            n = hi_up if size_up is None else size_up
            if cmd.mode == "split":
                chunk: ir.Expr = Const(amount, I64)
                trips = ir.Bin("/", ir.add(n, Const(amount - 1, I64)), chunk)
            else:
                chunk = Var(f"{inner}_chunk", I64)
                parts = Const(amount, I64)
                prelude.append(
                    ir.Decl(chunk, ir.Bin("/", ir.sub(ir.add(n, parts), Const(1, I64)), parts))
                )
                trips = parts
            o = Var(outer, I64)
            lo, hi = Var(f"{inner}_lo", I64), Var(f"{inner}_hi", I64)
            start = ir.add(lo_up, ir.mul(o, chunk))
            levels.append((o, trips, lo, start, hi, ir.minimum(ir.add(start, chunk), hi_up)))
            lo_up, hi_up, size_up = lo, hi, chunk
        body = stmts
        for o, trips, lo, start, hi, end in reversed(levels):
            head = [ir.Decl(lo, start), ir.Decl(hi, end)]
            body = [ir.For(o, Const(0, I64), trips, [*head, *body], label=o.name)]
        return [*prelude, *body]
