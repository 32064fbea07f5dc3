"""A row's loop nest as the row groups pass (``ucf.passes.row_groups``) reads it: which
loops run rows that are independent, the loops inside a row whose trip counts are the
same in every row, and the two shapes the pass groups (a row summed into scalars of its
own, a row accumulated into a row of the output at unit stride).

Split out of ``row_groups``, which rewrites what these recognise: reading a nest is
apart from rewriting it, and needs none of the rewriter's state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ucf.ir import nodes as ir
from ucf.ir.walk import names, substitute
from ucf.passes.tiling import ACCUMULATE, lanewise, serial_loop, unit_offset


@dataclass
class Level:
    """One loop of a row's nest: the declarations before it, the loop, the statements
    after it, and the level of the loop's body (None: the body holds no loop). A
    ``shared`` loop has the same bounds in every row, so the rows of a group share its
    variable; otherwise its trip count ``trip`` is the same, and each row's variable is
    its own start plus a shared count. A level without a loop is the innermost body,
    held in ``suffix``."""

    prefix: list[ir.Decl]
    loop: ir.For | None
    suffix: list[ir.Stmt]
    child: Level | None = None
    shared: bool = True
    trip: ir.Expr | None = None


def row_loop(s: ir.Stmt) -> bool:
    """A loop whose iterations are independent (``NoRaces``): threads run them, or one
    thread does (``ucf.lower.parallel.mark_independent``)."""
    return (
        isinstance(s, ir.For)
        and s.parallel in ("CPUThread", None)
        and s.strategy == "NoRaces"
        and not (s.prologue or s.epilogue or s.reduction or s.unroll)
    )


def nest_of(body: list[ir.Stmt], local: set[str]) -> Level | None:
    """``body`` as declarations, one loop whose trip count does not depend on the
    ``local`` variables (those that differ between rows), and statements after it,
    down to a body without loops; None if it is not."""
    body = [s for s in body if not isinstance(s, ir.Comment)]
    at = next((k for k, s in enumerate(body) if isinstance(s, ir.For)), None)
    if at is None:
        return Level([], None, body) if all(_straight(s) for s in body) else None
    prefix, loop, suffix = body[:at], body[at], body[at + 1 :]
    if not all(isinstance(s, ir.Decl) for s in prefix) or not all(_straight(s) for s in suffix):
        return None
    if not serial_loop(loop):
        return None
    local = local | {d.var.name for d in prefix}
    if not names([loop.start, loop.end]) & local:
        child = nest_of(loop.body, local)
        return None if child is None else Level(prefix, loop, suffix, child)
    end = loop.end
    if not (isinstance(end, ir.Bin) and end.op == "+" and end.left == loop.start):
        return None
    if names(end.right) & local:
        return None
    child = nest_of(loop.body, local | {loop.var.name})
    return None if child is None else Level(prefix, loop, suffix, child, False, end.right)


def _straight(s: ir.Stmt) -> bool:
    """A statement without nested statements that a row may run on its own."""
    return isinstance(s, ir.Decl | ir.Assign | ir.Store) and not getattr(s, "atomic", False)


def _levels(nest: Level) -> list[Level]:
    out = [nest]
    while out[-1].child is not None:
        out.append(out[-1].child)
    return out


def chains(nest: Level, row: str) -> bool:
    """Whether the innermost body sums into a variable of the row's own (a chain of
    dependent adds), and every assignment is to such a variable."""
    levels = _levels(nest)
    if len(levels) < 2:
        return False
    own = {row} | {d.var.name for lv in levels for d in lv.prefix}
    own |= {s.var.name for lv in levels for s in lv.suffix if isinstance(s, ir.Decl)}
    assigns = [s for lv in levels for s in lv.suffix if isinstance(s, ir.Assign)]
    return bool(assigns) and all(a.var.name in own for a in assigns)


@dataclass
class Tile:
    """A row's nest whose innermost loop ``inner`` accumulates ``store`` (its own
    declarations substituted) at ``base + j``, inside loops that leave ``base`` as it
    is."""

    inner: ir.For
    store: ir.Store
    base: ir.Expr
    level: Level  # the level whose loop is ``inner``


def tile_of(nest: Level) -> Tile | None:
    """``nest`` as a row accumulated into a row of the output at unit stride, or None."""
    levels = _levels(nest)
    if len(levels) < 3 or any(lv.suffix for lv in levels[:-2]):
        return None
    inner, body = levels[-2].loop, levels[-1].suffix
    if not levels[-2].shared or levels[-2].suffix or not body:
        return None
    mapping: dict[str, ir.Expr] = {}
    for d in body[:-1]:
        if not isinstance(d, ir.Decl):
            return None
        mapping[d.var.name] = substitute(d.init, mapping)
    store = body[-1]
    if not isinstance(store, ir.Store) or not store.accumulate:
        return None
    store = replace(
        store, index=substitute(store.index, mapping), value=substitute(store.value, mapping)
    )
    j, elem = inner.var.name, store.array.elem
    base = unit_offset(store.index, j)
    if base is None or elem not in ACCUMULATE or store.value.type != elem:
        return None
    # What the reduction loops declare must not move the tile, nor bound the loop over j.
    reduction = {lv.loop.var.name for lv in levels[:-2]}
    reduction |= {d.var.name for lv in levels[1:-1] for d in lv.prefix}
    if names([base, inner.start, inner.end]) & reduction:
        return None
    if not lanewise(store.value, j, store.array.name):
        return None
    return Tile(inner, store, base, levels[-2])
