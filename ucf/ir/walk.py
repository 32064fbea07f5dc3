"""Generic traversals of LLIR: one walker for every pass.

Statements name their nested statement lists (``Stmt.BLOCKS``) and every node
is a dataclass, so these functions walk any node, GPU nodes included, without
a visitor per pass or per node type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, is_dataclass, replace
from functools import cache

from ucf.ir import nodes as ir


def names(node) -> set[str]:
    """The names of the variables a node reads (``reads`` into a new set)."""
    acc: set[str] = set()
    reads(node, acc)
    return acc


def reads(node, acc: set[str]) -> None:
    """Names of variables read anywhere in a node (declarations' targets excluded)."""
    if isinstance(node, ir.Var):
        acc.add(node.name)
        return
    if isinstance(node, list):
        for x in node:
            reads(x, acc)
        return
    for name in _read_fields(type(node)):
        reads(getattr(node, name), acc)


@cache
def _read_fields(cls: type) -> tuple[str, ...]:
    """The fields of a node type that ``reads`` visits. Passes call it on every node of
    every kernel, and looking the dataclass fields up per node was most of its time."""
    if not is_dataclass(cls):
        return ()
    bound = "var" if issubclass(cls, ir.Decl | ir.Assign | ir.For) else None
    return tuple(f.name for f in fields(cls) if f.name != bound)


def blocks(s: ir.Stmt) -> list[list[ir.Stmt]]:
    """The statement lists nested directly inside a statement, in execution order."""
    return [getattr(s, name) for name in s.BLOCKS]


def with_blocks(s: ir.Stmt, rewrite: Callable[[list[ir.Stmt]], list[ir.Stmt]]) -> ir.Stmt:
    """A copy of ``s`` with each nested statement list passed through ``rewrite``."""
    if not s.BLOCKS:
        return s
    return replace(s, **{name: rewrite(getattr(s, name)) for name in s.BLOCKS})


def statements(stmts: list[ir.Stmt]):
    """Every statement, nested ones included, outermost first."""
    for s, _ in walk(stmts):
        yield s


def walk(stmts: list[ir.Stmt], path: tuple = ()):
    """Every statement with the statements that enclose it, outermost first."""
    for s in stmts:
        yield s, path
        for block in blocks(s):
            yield from walk(block, (*path, s))


def containers(stmts: list[ir.Stmt]):
    """``stmts`` and every statement list nested in it."""
    yield stmts
    for s in statements(stmts):
        yield from blocks(s)


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
        for name in _node_fields(type(node)):
            yield from nodes(getattr(node, name))


@cache
def _node_fields(cls: type) -> tuple[str, ...]:
    """The fields of a node type that ``nodes`` descends into (none of an array's or a
    parameter's)."""
    if issubclass(cls, ir.Array | ir.Param):
        return ()
    return tuple(f.name for f in fields(cls))


def fresh_name(name: str, taken: set[str]) -> str:
    """``name`` with the first number from 0 that makes it a name not in ``taken``
    (which then holds it): the scalars and arrays the passes add beside a kernel's own."""
    k = 0
    while f"{name}{k}" in taken:
        k += 1
    taken.add(f"{name}{k}")
    return f"{name}{k}"
