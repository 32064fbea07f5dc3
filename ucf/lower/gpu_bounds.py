"""Loop bounds of the GPU mapping folded to constants or expanded in place
(``ucf.lower.gpu_grid`` and ``ucf.lower.gpu_lanes``): a thread-level GPU loop needs
a trip count known when the kernel is compiled, a group loop's guard is dropped when
its count is, and a grid's extents are written in what the host knows before the
launch."""

from __future__ import annotations

from ucf.errors import ScheduleError
from ucf.ir import nodes as ir
from ucf.ir.nodes import Const, Var
from ucf.ir.walk import reads, statements


def single_definitions(fn: ir.Function) -> dict[str, ir.Expr]:
    """Declarations of variables declared exactly once: enough to fold loop bounds."""
    seen: dict[str, list[ir.Expr]] = {}
    for s in statements(fn.body):
        if isinstance(s, ir.Decl):
            seen.setdefault(s.var.name, []).append(s.init)
        elif isinstance(s, ir.For):
            seen.setdefault(s.var.name, []).extend([None, None])
    return {k: v[0] for k, v in seen.items() if len(v) == 1}


def fold_constant(e: ir.Expr, defs: dict[str, ir.Expr], upper: bool = False) -> int | None:
    """The value of an integer expression when it is constant; with ``upper``, a
    constant upper bound through ``min`` (a clipped split's inner bound)."""
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Var):
        d = defs.get(e.name)
        return None if d is None else fold_constant(d, defs, upper)
    if isinstance(e, ir.Cast):
        return fold_constant(e.operand, defs, upper)
    if isinstance(e, ir.Bin):
        a, b = fold_constant(e.left, defs, upper), fold_constant(e.right, defs, upper)
        if e.op == "min" and upper:
            known = [x for x in (a, b) if x is not None]
            return min(known) if known else None
        if a is None or b is None:
            return None
        if e.op in ("+", "-", "*", "min", "max"):
            return {"+": a + b, "-": a - b, "*": a * b, "min": min(a, b), "max": max(a, b)}[e.op]
        if e.op in ("/", "%") and b > 0 and a >= 0:
            return a // b if e.op == "/" else a % b
    return None


def inline_definitions(e: ir.Expr, defs: dict[str, ir.Expr]) -> ir.Expr:
    """``e`` with the named variables replaced by their definitions, transitively."""
    from ucf.ir.walk import substitute

    for _ in range(64):
        names: set[str] = set()
        reads(e, names)
        todo = {n: defs[n] for n in names if n in defs}
        if not todo:
            return e
        e = substitute(e, todo)
    raise ScheduleError("a GPU loop bound is defined circularly")  # pragma: no cover
