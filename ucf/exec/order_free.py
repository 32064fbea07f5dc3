"""Which operands a kernel reads correctly whatever the order of their coordinates.

A scipy matrix a user passes is checked on every call (``ucf.exec.scipy_operands``),
since nothing stops its arrays changing between calls. That its coordinates are in
bounds is what keeps the kernel's reads in memory, and is always checked. That they
are sorted and unique within each row matters only to kernels that rely on it: a
merge with another operand's coordinates, a search, a window, a split by coordinate,
a store of the operand's structure into a sparse output, an assignment (not a sum)
at a place a coordinate chose. An SpMV, ``A^T x``, SpMM or ``x' A y`` over a CSR
only walks each row's positions, loads at the coordinates it finds there and adds
what it computes, so a row in any order gives scipy's own answer, repeated
coordinates summed as scipy sums them (the statement is linear in the operand).
Checking the order costs a pass over the indices that such a call need not pay.

The answer is read off the kernel's LLIR, not its schedule, so that no schedule,
pass or default can make a kernel rely on an order this module did not see: a
value loaded from one of the operand's coordinate arrays, and anything computed
from it, may only index a load, a prefetch or an accumulating store. Compared,
bounding a loop, deciding a branch, stored as a value, written to by a plain
store's index, passed to a call: any of these, and the operand's order is checked.
"""

from __future__ import annotations

from ucf.codegen.kernel_plan import Plan
from ucf.format.format import Format
from ucf.ir import nodes as ir
from ucf.ir import walk
from ucf.lang.ast import accesses
from ucf.lang.rewrite import linear_in


class _Relies(Exception):
    """A use of a coordinate that depends on the coordinates' order or uniqueness."""


def order_free(plan: Plan) -> dict[str, Format]:
    """The operands the plan reads correctly with their coordinates in any order and
    repeated coordinates summed, each with the structure the kernel reads it in: read
    once (so linearly, ``linear_in``), in their own format (not a copy in another),
    holding plain values with fill 0, whose stored coordinates are not a sparse output's,
    by a CPU kernel none of whose functions uses them but to locate loads and added
    stores. An operand stored in another
    structure is converted first, which relies on its order: the caller compares.
    Empty for a blocked or GPU plan, whose operands take other paths."""
    return _free(plan, 0)


def tail_free(plan: Plan) -> dict[str, Format]:
    """The operands the plan reads correctly when the coordinates of their first stored
    level are as the format says (sorted; unique if the level is) and those of the
    levels below it in any order, repeats summed: as :func:`order_free`, with the first
    stored level's coordinate array used in any way. A scipy COO whose rows are sorted
    is such a COO whatever the order of its columns, and a DCSR built from a CSR's
    ``indptr`` such a DCSR (``ucf.exec.scipy_operands``)."""
    return _free(plan, 1)


def _free(plan: Plan, skipped: int) -> dict[str, Format]:
    """``order_free`` (``skipped`` 0), or ``tail_free`` (1: the first stored level's
    coordinates are used in any way), for operands with more stored levels than that."""
    if plan.blocking is not None or plan.cuda_source or plan.cin.diagonals or plan.integer_sums:
        return {}
    functions = [f for f in (plan.assemble, plan.compute, *plan.helpers) if f is not None]
    slots: dict[str, list] = {}
    for slot in plan.cin.slots.values():
        slots.setdefault(slot.tensor, []).append(slot)
    free = {}
    for name, held in slots.items():
        fmt = held[0].format
        if (
            len(held) != 1
            or held[0].name != name
            or fmt.fill
            or (fmt.values is not None and not fmt.values.plain)
            or not linear_in(plan.statement.rhs, name)
        ):
            continue
        stored = [lvl for lvl, kind in enumerate(fmt.levels) if kind.coordinate_array]
        if not plan.computed_format.is_dense and _places_output(plan, name, fmt, stored):
            continue
        roles = {(fmt.levels[lvl].coordinate_array, name, lvl) for lvl in stored[skipped:]}
        if roles and all(_orderless(f, roles) for f in functions):
            free[name] = fmt.structure
    return free


def _places_output(plan: Plan, name: str, fmt: Format, stored: list[int]) -> bool:
    """Whether a coordinate of ``name`` stored at ``stored`` levels is (or may be) a
    coordinate of the sparse output: then its repeats would be the output's, whatever
    the code does with them (a transpose into CSC). Only plain variables answer no."""
    access = next(a for a in accesses(plan.statement.rhs) if a.tensor == name)
    out = set(plan.cin.output_vars)
    for lvl in stored:
        var = access.indices[fmt.maps[lvl].mode].single_variable
        if var is None or var in out:
            return True
    return False


def _orderless(fn: ir.Function, roles: set[tuple]) -> bool:
    """Whether ``fn`` uses the arrays of ``roles`` only as ``order_free`` allows. Values
    carried by variables are followed to a fixed point (a loop may assign a variable
    that an earlier statement of its body read)."""
    arrays = {p.name for p in fn.params if p.role in roles}
    if not arrays:
        return True
    tainted: set[str] = set()
    try:
        while True:
            before = len(tainted)
            _statements(fn.body, arrays, tainted)
            if len(tainted) == before:
                return True
    except _Relies:
        return False


def _statements(stmts: list[ir.Stmt], arrays: set[str], tainted: set[str]) -> None:
    for s in stmts:
        if isinstance(s, ir.Decl | ir.Assign):
            value = s.init if isinstance(s, ir.Decl) else s.value
            if _taint(value, arrays, tainted):
                tainted.add(s.var.name)
        elif isinstance(s, ir.Store):
            at, value = _taint(s.index, arrays, tainted), _taint(s.value, arrays, tainted)
            if s.array.name in arrays or value or (at and not (s.accumulate or _adds(s))):
                raise _Relies
        elif isinstance(s, ir.Prefetch):
            _taint(s.index, arrays, tainted)
        elif isinstance(s, ir.For):
            bounds = [s.start, s.end, *([s.parallel_if] if s.parallel_if is not None else [])]
            if any(_taint(e, arrays, tainted) for e in bounds):
                raise _Relies
        elif isinstance(s, ir.While | ir.If):
            if _taint(s.cond, arrays, tainted):
                raise _Relies
        elif isinstance(s, ir.Alloc):
            if _taint(s.size, arrays, tainted):
                raise _Relies
        elif not isinstance(s, ir.Free | ir.Comment | ir.Pause | ir.Yield):
            # A call, an atomic claim, a GPU statement: anything of the arrays or of a
            # value taken from them reaching it is a use this module does not follow.
            _untouched(s, arrays, tainted)
        for block in walk.blocks(s):
            _statements(block, arrays, tainted)


def _adds(s: ir.Store) -> bool:
    """Whether a plain store adds to the element it writes (``y[j] = fma(a, b, y[j])``,
    ``y[j] = y[j] + t``): an accumulation spelled as a load and a store."""
    v = s.value

    def same(e) -> bool:
        return isinstance(e, ir.Load | ir.VLoad) and e.array == s.array and e.index == s.index

    if isinstance(v, ir.FMA):
        return same(v.addend)
    return isinstance(v, ir.Bin) and v.op == "+" and (same(v.left) or same(v.right))


def _taint(e, arrays: set[str], tainted: set[str]) -> bool:
    """Whether ``e``'s value is computed from a coordinate; raises ``_Relies`` where
    ``e`` itself uses one in a way that depends on the order."""
    if isinstance(e, ir.Var):
        return e.name in tainted
    if isinstance(e, ir.Const):
        return False
    if isinstance(e, ir.Load | ir.VLoad):
        at = _taint(e.index, arrays, tainted)
        if e.array.name in arrays:
            if at:
                raise _Relies  # a coordinate array read at a coordinate
            return True
        return False  # a value of another array: data, whatever chose where
    if isinstance(e, ir.Cmp | ir.Logic):
        if _taint(e.left, arrays, tainted) | _taint(e.right, arrays, tainted):
            raise _Relies
        return False
    if isinstance(e, ir.Select):
        if _taint(e.cond, arrays, tainted):
            raise _Relies
        return _taint(e.if_true, arrays, tainted) | _taint(e.if_false, arrays, tainted)
    if isinstance(e, ir.Bin):
        found = _taint(e.left, arrays, tainted) | _taint(e.right, arrays, tainted)
        if found and e.op in ("min", "max"):
            raise _Relies  # the heart of a merge
        return found
    if isinstance(e, ir.Cast | ir.Neg | ir.Splat | ir.Lane | ir.Math):
        return _taint(e.operand, arrays, tainted)
    if isinstance(e, ir.FMA):
        return any([_taint(x, arrays, tainted) for x in (e.left, e.right, e.addend)])
    # Anything else (a GPU expression, a packed dot product): refused if a coordinate
    # or a coordinate array reaches it at all.
    _untouched(e, arrays, tainted)
    return False


def _untouched(node, arrays: set[str], tainted: set[str]) -> None:
    """Raises ``_Relies`` where one of ``arrays``, or a variable computed from them
    (``tainted``), appears anywhere in ``node``."""
    for n in walk.nodes(node):
        if isinstance(n, ir.Array) and n.name in arrays:
            raise _Relies
        if isinstance(n, ir.Var) and n.name in tainted:
            raise _Relies
