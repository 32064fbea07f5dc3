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
        out.append(s)
    return out


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
