"""Clean-ups on LLIR that keep generated C warning-free under -Wall -Werror."""

from __future__ import annotations

from dataclasses import replace

from ucf.ir import nodes as ir
from ucf.ir.walk import reads, with_blocks


def _prune(stmts: list[ir.Stmt], live: set[str]) -> list[ir.Stmt]:
    out: list[ir.Stmt] = []
    for s in stmts:
        if isinstance(s, ir.Decl | ir.Assign) and s.var.name not in live:
            continue
        s = with_blocks(s, lambda block: _prune(block, live))
        if isinstance(s, ir.If) and not s.then and not s.orelse:
            continue
        out.append(_at_most_once(s))
    return out


def _at_most_once(s: ir.Stmt) -> ir.Stmt:
    """A serial loop whose body only sets variables to constants (a sparse output's hit
    flag over SDDMM's ``k`` in its assemble pass, once the sum is gone) as an ``if``: the
    body's effect is the same after one iteration as after all. LLVM kept the loop,
    which made SDDMM's assemble pass cost as much as its compute."""
    if (
        isinstance(s, ir.For)
        and s.body
        and s.parallel is None
        and not (s.prologue or s.epilogue or s.reduction)
        and all(isinstance(b, ir.Assign) and isinstance(b.value, ir.Const) for b in s.body)
    ):
        return ir.If(ir.Cmp("<", s.start, s.end), s.body)
    return s


def remove_dead_variables(fn: ir.Function) -> ir.Function:
    """Drop declarations and assignments of variables nothing reads, to a fixpoint.

    Loads have no side effects, so dropping an unread declaration is safe.
    """
    body = fn.body
    while True:
        live: set[str] = set()
        reads(body, live)
        new = _prune(body, live)
        if new == body:
            return replace(fn, body=new)
        body = new
