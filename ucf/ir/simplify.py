"""Clean-ups on LLIR that keep generated C warning-free under -Wall -Werror."""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace

from ucf.ir import nodes as ir


def reads(node, acc: set[str]) -> None:
    """Names of variables read anywhere in a node (declarations' targets excluded)."""
    if isinstance(node, ir.Var):
        acc.add(node.name)
        return
    if isinstance(node, list):
        for x in node:
            reads(x, acc)
        return
    if not is_dataclass(node):
        return
    for f in fields(node):
        if isinstance(node, ir.Decl | ir.Assign) and f.name == "var":
            continue
        if isinstance(node, ir.For) and f.name == "var":
            continue
        reads(getattr(node, f.name), acc)


def _prune(stmts: list[ir.Stmt], live: set[str]) -> list[ir.Stmt]:
    out: list[ir.Stmt] = []
    for s in stmts:
        if isinstance(s, ir.Decl | ir.Assign) and s.var.name not in live:
            continue
        if isinstance(s, ir.For):
            s = replace(
                s,
                body=_prune(s.body, live),
                prologue=_prune(s.prologue, live),
                epilogue=_prune(s.epilogue, live),
            )
        elif isinstance(s, ir.While):
            s = replace(s, body=_prune(s.body, live))
        elif isinstance(s, ir.If):
            then, orelse = _prune(s.then, live), _prune(s.orelse, live)
            if not then and not orelse:
                continue
            s = ir.If(s.cond, then, orelse)
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


def blocks(s: ir.Stmt) -> list[list[ir.Stmt]]:
    """The statement lists nested directly inside a statement."""
    if isinstance(s, ir.For):
        return [s.prologue, s.body, s.epilogue]
    if isinstance(s, ir.While):
        return [s.body]
    if isinstance(s, ir.If):
        return [s.then, s.orelse]
    return []


def statements(stmts: list[ir.Stmt]):
    """Every statement, nested ones included, outermost first."""
    for s in stmts:
        yield s
        for block in blocks(s):
            yield from statements(block)


def declared(stmts: list[ir.Stmt]) -> set[str]:
    """Variables declared (by Decl or as a loop variable) anywhere in the statements."""
    return {s.var.name for s in statements(stmts) if isinstance(s, ir.Decl | ir.For)}


def assigned(stmts: list[ir.Stmt]) -> set[str]:
    """Variables assigned (not declared) anywhere in the statements."""
    return {s.var.name for s in statements(stmts) if isinstance(s, ir.Assign)}


def substitute(node, mapping: dict[str, ir.Expr]):
    """A copy of an LLIR tree with the named variables replaced (reads and writes alike)."""
    if isinstance(node, ir.Var):
        new = mapping.get(node.name)
        return node if new is None else new
    if isinstance(node, list):
        return [substitute(x, mapping) for x in node]
    if isinstance(node, tuple):
        return tuple(substitute(x, mapping) for x in node)
    if not is_dataclass(node) or isinstance(node, ir.Array | ir.Param):
        return node
    return replace(
        node, **{f.name: substitute(getattr(node, f.name), mapping) for f in fields(node)}
    )


def loops(stmts: list[ir.Stmt]):
    """Every loop in the statements, outermost first, with the list that holds it."""
    for s in stmts:
        if isinstance(s, ir.For | ir.While):
            yield stmts, s
        for block in blocks(s):
            yield from loops(block)


def nodes(node):
    """Every LLIR node in a tree (statements, expressions, arrays), parents first."""
    if isinstance(node, list | tuple):
        for x in node:
            yield from nodes(x)
    elif is_dataclass(node):
        yield node
        if not isinstance(node, ir.Array | ir.Param):
            for f in fields(node):
                yield from nodes(getattr(node, f.name))
