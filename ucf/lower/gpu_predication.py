"""Zero extension: every lane of a group reaches every collective (``ucf.lower.gpu_grid``)."""

from __future__ import annotations

from ucf.errors import ScheduleError
from ucf.ir import nodes as ir
from ucf.ir.gpu_nodes import GROUP_CALLS
from ucf.ir.nodes import Const, Var
from ucf.ir.walk import (
    names,
    nodes,
    statements,
)
from ucf.lower.gpu_loops import GpuLoop, several_entries


class Predicator:
    """Rewrite a group's body so that every lane reaches every collective.

    Conditions that differ between the lanes of a tile (lane-variant) no longer
    branch around a collective: they become a predicate, and an inactive lane
    contributes zero to an entry of -1 (which the helpers skip). Declarations
    under a predicate are evaluated only when it holds (``p ? init : 0``), and
    other statements keep their ``if``. Loops that contain a collective must
    run the same number of times in every lane.
    """

    def __init__(self, variant: set[str], by_id: dict[int, GpuLoop], group: GpuLoop):
        self.variant = set(variant)
        self.by_id = by_id
        self.group = group
        self.count = 0

    def _varies(self, e) -> bool:
        return bool(names(e) & self.variant)

    def block(self, stmts: list[ir.Stmt], pred: ir.Expr | None) -> list[ir.Stmt]:
        out: list[ir.Stmt] = []
        pending: list[ir.Stmt] = []

        def flush():
            if pending and pred is None:
                out.extend(pending)
            elif pending:
                out.append(ir.If(pred, list(pending)))
            pending.clear()

        for s in stmts:
            if not collective(s):
                if isinstance(s, ir.Decl):
                    flush()
                    out.append(self._decl(s, pred))
                else:
                    pending.append(s)
                continue
            flush()
            out += self._collective(s, pred)
        flush()
        return out

    def _decl(self, s: ir.Decl, pred) -> ir.Decl:
        if self._varies(s.init):
            self.variant.add(s.var.name)
        if pred is None or safe(s.init):
            return s
        self.variant.add(s.var.name)
        return ir.Decl(s.var, ir.Select(pred, s.init, ir.const_like(s.init, 0)))

    def _collective(self, s: ir.Stmt, pred) -> list[ir.Stmt]:
        g = self.group
        if isinstance(s, ir.Call):
            arr, index, value, size = s.args
            if s.name == "atomicAddGroup" and self._varies(index):
                raise several_entries(g)
            if pred is None:
                return [s]
            if s.name == "segReduceGroup":
                index = ir.Select(pred, index, Const(-1, index.type))
            value = ir.Select(pred, value, ir.const_like(value, 0))
            return [ir.Call(s.name, [arr, index, value, size])]
        if isinstance(s, ir.For):
            if self._varies([s.start, s.end]):
                raise ScheduleError(
                    f"{g.cmd}: the loop over {s.label or s.var.name} inside group "
                    f"{g.label} runs a different number of times in each lane, but every lane "
                    "must reach the group's reduction together"
                )
            s.body = self.block(s.body, pred)  # in place: GPU loops are known by identity
            return [s]
        if isinstance(s, ir.If):
            if not self._varies(s.cond):
                then = self.block(s.then, pred)
                return [ir.If(s.cond, then, self.block(s.orelse, pred))]
            if any(collective(x) for x in s.orelse):
                raise ScheduleError(
                    f"{g.cmd}: a reduction in both branches of a lane-dependent condition is "
                    "not supported"
                )
            self.count += 1
            p = Var(f"{g.loop.var.name}_on{self.count}", "i1")
            self.variant.add(p.name)
            cond = s.cond if pred is None else ir.Select(pred, s.cond, Const(False, "i1"))
            out: list[ir.Stmt] = [ir.Decl(p, cond)]
            if s.orelse:
                out.append(ir.If(ir.Cmp("==", p, Const(False, "i1")), s.orelse))
                if pred is not None:
                    out[-1] = ir.If(pred, [out[-1]])
            return out + self.block(s.then, p)
        raise ScheduleError(
            f"{g.cmd}: a reduction inside a while loop of group {g.label} cannot be reached "
            "by every lane together"
        )


def collective(s: ir.Stmt) -> bool:
    return any(isinstance(x, ir.Call) and x.name in GROUP_CALLS for x in statements([s]))


def safe(e: ir.Expr) -> bool:
    """Evaluating ``e`` for an inactive lane cannot fault: no loads, no division by a variable."""
    for n in nodes(e):
        if isinstance(n, ir.Load):
            return False
        if isinstance(n, ir.Bin) and n.op in ("/", "%") and not isinstance(n.right, Const):
            return False
    return True
