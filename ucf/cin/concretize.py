"""Choose a loop order from the iteration graph, converting operands when none fits.

Sparse operands (any non-dense level) must be walked in level order: each of
their levels is an edge in the iteration graph that must hold.  Dense
operands and a dense output only prefer an order (for locality).  Rather
than failing on a cycle, as TACO does, we pick the order that needs the
fewest operand conversions, convert those operands to a compatible mode
ordering, and say so in the CIN.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import replace

from ucf.cin.notation import CIN, Slot
from ucf.errors import ScheduleError, UnsupportedError
from ucf.format.format import Format
from ucf.lang.ast import Access, Statement, accesses
from ucf.lang.reductions import free_variables, peel, sums

_MAX_EXHAUSTIVE = 7


def level_vars(access: Access, fmt: Format, order: list[str]) -> list[str]:
    """The variable each storage level is resolved at, outer to inner.

    A plain index is its own variable; an affine one (``p + r``) is resolved
    at whichever of its variables the loop order binds last, its base.
    """
    position = {v: k for k, v in enumerate(order)}
    return [access.indices[m].base(position) for m in fmt.mode_order]


def walked_layout(access: Access, fmt: Format, order: Sequence[str]) -> Format | None:
    """The dense format that stores ``access``'s modes in the order the loop order
    binds their variables (SDDMM's ``D(k,j)`` under loops ``i, j, k``: column-major,
    ``UU:1,0``), where that is not ``fmt``'s own; None where the loops walk ``fmt`` as
    stored, or an index is not a single variable (an affine one resolves at its base,
    and a blocked or value-held format is not relaid)."""
    if not fmt.is_dense or fmt.blocked or (fmt.values is not None and not fmt.values.plain):
        return None
    names = [i.single_variable for i in access.indices]
    if None in names or len(set(names)) != len(names) or not set(names) <= set(order):
        return None
    pos = {v: k for k, v in enumerate(order)}
    walked = tuple(sorted(range(len(names)), key=lambda m: pos[names[m]]))
    if walked == fmt.mode_order:
        return None
    return fmt.with_mode_order(walked)


def _level_sets(access: Access, fmt: Format) -> list[tuple[str, ...]]:
    return [access.indices[m].variables for m in fmt.mode_order]


def appended_vars(lhs: Access, fmt: Format) -> set[str]:
    """Output variables that a sparse output appends coordinates for.

    Levels below the last compressed one that are dense may be accumulated
    into inside reductions: their positions exist once the coordinates above
    them are appended, so only these variables must enclose every reduction.
    """
    compressed = [k for k, lvl in enumerate(fmt.levels) if not lvl.full]
    if not compressed:
        return set()
    return {lhs.indices[m].single_variable for m in fmt.mode_order[: compressed[-1] + 1]}


#: A precompute as the loop order sees it: the texts of its expression's accesses, and
#: the variable its workspace is indexed by.
Gathered = tuple[frozenset[str], str]


def nesting(
    stmt: Statement, gathered: Sequence[Gathered] = ()
) -> list[tuple[str, set[str], tuple[str, ...]]]:
    """For each nested sum: its text, the variables its value depends on, and its own.

    A nested sum is computed into a temporary once the first are fixed, so in any
    loop order they come before its own variables. A sum that a precompute gathers
    into a workspace over ``v`` (every access of the sum is in the precompute's
    expression, ``gathered``) is computed for every ``v`` at once, a row of the
    workspace, so its own variables may run outside ``v`` (Gustavson's ``i, k, j``)."""
    body = peel(stmt.rhs)[1]
    found = []
    for s in sums(body):
        free = free_variables(s)
        texts = {str(a) for a in accesses(s)}
        free -= {v for within, v in gathered if texts <= within}
        found.append((str(s), free, s.vars))
    return found


#: How to run a nested sum's loops in another order, said where its nesting forbids one.
UNNEST = (
    "to order its loops freely, compute the sum alone and add the other terms with '+=' or "
    "a second statement"
)


def check_nesting(stmt: Statement, order: list[str], gathered: Sequence[Gathered] = ()) -> None:
    """Refuse a loop order that runs a nested sum's loops outside a variable it needs."""
    pos = {v: k for k, v in enumerate(order)}
    for text, free, own in nesting(stmt, gathered):
        for v in own:
            late = sorted((f for f in free if pos[f] > pos[v]), key=pos.__getitem__)
            if late:
                w = late[-1]
                raise ScheduleError(
                    f"reorder: {v} is summed in {text}, a part of the right-hand side whose "
                    f"value is needed for each {w}, so the loop over {v} must be inside the "
                    f"loop over {w} (loop order {', '.join(order)}); {UNNEST}"
                )


def nesting_conflict(stmt: Statement, access: Access, fmt: Format) -> str | None:
    """Why no loop order can walk ``access``'s levels in ``fmt`` in order, when a nested
    sum is the reason: a level over a variable it sums stored above a level over a
    variable its value depends on."""
    chain = _level_sets(access, fmt)
    for text, free, own in nesting(stmt):
        for k, upper in enumerate(chain):
            summed = [v for v in upper if v in own]
            needed = [v for lower in chain[k + 1 :] for v in lower if v in free]
            if summed and needed:
                return (
                    f"{access.tensor} stores {summed[0]} above {needed[0]}, but {summed[0]} is "
                    f"summed in {text}, a part of the right-hand side whose value is needed "
                    f"for each {needed[0]}, so its loop runs inside {needed[0]}'s; {UNNEST}"
                )
    return None


def _nesting_ok(nested: list, pos: dict[str, int]) -> bool:
    return all(pos[f] < pos[v] for _, free, own in nested for f in free for v in own)


def check_indices(stmt: Statement) -> None:
    """Refuse the index forms the lowering has no algorithm for, naming the access."""
    for idx in stmt.lhs.indices:
        if idx.single_variable is None:
            raise UnsupportedError(
                f"output {stmt.lhs}: index '{idx}' is affine; an output index must be a plain "
                "index variable (write the affine index on an operand instead)"
            )
    for a in accesses(stmt.rhs):
        for m, idx in enumerate(a.indices):
            if idx.is_constant:
                raise UnsupportedError(
                    f"access {a}: index '{idx}' of mode {m} is a constant; constant indices are "
                    "not supported yet (slice the operand before the call)"
                )


def concretize(
    stmt: Statement,
    formats: dict[str, Format],
    output_format: Format,
    order: list[str] | None = None,
    workspace: bool = False,
    gathered: Sequence[Gathered] = (),
    before: dict[str, set[str]] | None = None,
    freed: frozenset[str] = frozenset(),
    walk: Sequence[str] | None = None,
    walked: Mapping[int, str] | None = None,
) -> CIN:
    """The loop order and operand storage for a statement.

    ``workspace`` says a precompute will give the output a workspace, so a
    sparse output no longer needs its variables outside every reduction;
    ``gathered`` lists the precomputes (see ``nesting``), which free the nested
    sums they gather from being computed inside their workspace's variable.
    ``before`` maps a variable to those every loop order binds before it (a
    block's place after its block: ``ucf.cin.blocking``). ``freed`` names the operands
    a schedule's ``convert`` freed from binding the order, for the note on their copy;
    a dense one is copied in the order ``walk`` gives its variables (the loop order's
    where None). ``walked`` maps the accesses (by number) that a precompute's producer
    walks as stored in loops of its own (``ucf.schedule.own_order``) to its workspace:
    they bind no loop order and are read as stored.
    """
    walked = dict(walked or {})
    rhs = accesses(stmt.rhs)
    check_indices(stmt)
    workspace = workspace or bool(gathered)
    out_vars = [i.single_variable for i in stmt.lhs.indices]
    all_vars = list(
        dict.fromkeys(out_vars + [v for a in rhs for i in a.indices for v in i.variables])
    )
    red_vars = list(peel(stmt.rhs)[0])
    nested = nesting(stmt, gathered)

    hard: list[tuple[int, Chain]] = []  # (access number, chain)
    soft: list[Chain] = []
    for n, a in enumerate(rhs):
        chain = _level_sets(a, formats[a.tensor])
        if formats[a.tensor].is_dense:
            soft.append(chain)
        else:
            plain = [c[0] for c in chain if len(c) == 1]
            if len(set(plain)) != len(plain):
                raise UnsupportedError(
                    f"access {a}: a repeated index variable in a sparse operand is not supported"
                )
            if n not in walked:
                hard.append((n, chain))
    out_chain = _level_sets(stmt.lhs, output_format)
    sparse_out = not output_format.is_dense
    appended = appended_vars(stmt.lhs, output_format)

    # Orders every loop order keeps: the caller's, and a sparse level's new variable
    # after the others of its affine index (else two levels resolve at one loop, which
    # no conversion undoes: the offset of a diagonal, A(i, i + i_d), after i).
    needed = {v: set(b) for v, b in (before or {}).items()}
    for _, c in hard:
        for first_var, then in _anchors(c)[1:]:
            needed.setdefault(then, set()).add(first_var)

    def fixed_ok(perm: tuple[str, ...]) -> bool:
        pos = {v: k for k, v in enumerate(perm)}
        if not _nesting_ok(nested, pos):
            return False
        if any(pos[b] > pos[v] for v, bs in needed.items() for b in bs if b in pos and v in pos):
            return False
        if not sparse_out:
            return True
        if _violations(out_chain, pos):
            return False
        return workspace or all(pos[o] < pos[r] for o in appended for r in red_vars)

    preference = {v: k for k, v in enumerate(all_vars)}
    if order is not None:
        check_nesting(stmt, list(order), gathered)
        best = tuple(order)
    else:
        best = None
        best_key = None
        # Plain levels only: which variable an affine level resolves at depends on the order.
        plain = [a for c in [*(c for _, c in hard), *soft, out_chain] for a in _anchors(c)]
        plain += [[f, v] for _, free, own in nested for f in free for v in own]
        needs = {v: set(free) for _, free, own in nested for v in own}
        for v, bs in needed.items():
            needs.setdefault(v, set()).update(bs)
        first = [c[0] for c in out_chain if c[0] in appended]
        whole = [c[0] for c in out_chain]
        for perm in _candidates(all_vars, plain, first, needs, whole):
            if not fixed_ok(perm):
                continue
            pos = {v: k for k, v in enumerate(perm)}
            violated = [n for n, c in hard if _violations(c, pos, strict=True)]
            key = (
                sum(1 for n in violated if _requantizes(rhs[n], formats[rhs[n].tensor], pos)),
                len(violated),
                sum(_violations(c, pos) for c in soft) + _violations(out_chain, pos),
                [preference[v] for v in perm],
            )
            if best_key is None or key < best_key:
                best, best_key = perm, key
    if best is None:
        raise UnsupportedError(
            f"{stmt}: no loop order computes each nested sum where its value is needed and "
            "appends the sparse output in order; store the output dense"
        )
    pos = {v: k for k, v in enumerate(best)}

    notes: list[str] = []
    slots: dict[int, Slot] = {}
    converted: dict[tuple[str, Format], str] = {}
    for n, a in enumerate(rhs):
        fmt = formats[a.tensor]
        if n in walked:
            slots[n] = Slot(a.tensor, a.tensor, fmt)
            notes.append(
                f"operand {a.tensor} is read as stored ('{fmt.name}') in {a}: the producer of "
                f"workspace {walked[n]} runs its loops in {a.tensor}'s level order, scattering "
                f"into {walked[n]}, so it is not converted"
            )
        elif not fmt.is_dense and _violations(_level_sets(a, fmt), pos, strict=True):
            new = _regrouped(fmt, _reordered(a, fmt, pos))
            new = _searchable(a, new) or new
            if _violations(_level_sets(a, new), pos, strict=True):
                raise UnsupportedError(
                    f"access {a}: two levels of sparse operand {a.tensor} would be resolved at "
                    f"one loop in the order {', '.join(best)}; store {a.tensor} dense"
                )
            name = converted.setdefault((a.tensor, new), f"{a.tensor}_as{len(converted) + 1}")
            slots[n] = Slot(name, a.tensor, new)
            why = nesting_conflict(stmt, a, fmt)
            follows = (
                f"the loop order does not follow it (convert({a.tensor}) allows that)"
                if a.tensor in freed
                else "no loop order follows it"
            )
            msg = (
                f"operand {a.tensor} is stored as '{fmt.name}' but {follows}"
                f"{f' ({why})' if why else ''}; it is converted to '{new}' before each call"
                + _dequantized(fmt, new)
            )
            notes.append(msg)
        elif not fmt.is_dense and (new := _searchable(a, fmt)) is not None:
            new = _regrouped(fmt, new)
            name = converted.setdefault((a.tensor, new), f"{a.tensor}_as{len(converted) + 1}")
            slots[n] = Slot(name, a.tensor, new)
            notes.append(
                f"operand {a.tensor} is stored as '{fmt.name}', whose levels cannot be searched "
                f"for the affine indices of {a}; it is converted to '{new}' before each call"
                + _dequantized(fmt, new)
            )
        elif fmt.is_dense and (new := walked_layout(a, fmt, walk or best)) and a.tensor in freed:
            name = converted.setdefault((a.tensor, new), f"{a.tensor}_as{len(converted) + 1}")
            slots[n] = Slot(name, a.tensor, new)
            notes.append(
                f"operand {a.tensor} is stored as '{fmt.name}' but the loops read it along "
                f"another mode (convert({a.tensor})); it is copied to '{new.name}' before each "
                "call, on the kernel's threads"
            )
        else:
            slots[n] = Slot(a.tensor, a.tensor, fmt)
    copied = {t for t, _ in converted}
    for a in rhs:
        fmt = formats[a.tensor]
        if a.tensor in freed and fmt.is_dense and a.tensor not in copied:
            if fmt.blocked or (fmt.values is not None and not fmt.values.plain):
                raise ScheduleError(
                    f"convert({a.tensor}): dense operand {a.tensor} ('{fmt.name}') is "
                    "blocked or holds encoded values, and convert copies plain dense "
                    "operands only"
                )
            if any(i.single_variable is None for i in a.indices):
                raise ScheduleError(
                    f"convert({a.tensor}): {a.tensor} is indexed by expressions, and convert "
                    "copies a dense operand indexed by plain variables only"
                )
            raise ScheduleError(
                f"convert({a.tensor}): the loops ({', '.join(walk or best)} innermost last) "
                f"walk dense operand {a.tensor} ('{formats[a.tensor].name}') in its storage "
                "order already; convert reads a dense operand in the order the loops walk it"
            )
    notes.insert(0, f"loop order {', '.join(best) or '(none)'}")
    return CIN(stmt, list(best), slots, output_format, notes, walked=walked)


Chain = list[tuple[str, ...]]  # the variables of each level's index, outer to inner


def _anchors(chain: Chain) -> list[list[str]]:
    """The chains of variables that order a chain's levels for the topological orders:
    its plain levels' variables and an affine level's one variable that no level above
    holds (the offset ``d`` of ``A(i, i + d)``), in level order, plus that variable
    after each other variable of its level (``i`` before ``d``: the level resolves at
    ``d`` only if ``d`` comes later; for a sparse operand the topological orders hold
    to that). An affine level of two new variables resolves at whichever the order
    binds last, so it orders nothing."""
    seen: set[str] = set()
    order: list[str] = []
    after: list[list[str]] = []
    for level in chain:
        new = [v for v in level if v not in seen]
        if len(level) == 1:
            order.append(level[0])
        elif len(new) == 1:
            order.append(new[0])
            after += [[v, new[0]] for v in level if v != new[0]]
        seen.update(level)
    return [order, *after]


def _searchable(a: Access, fmt: Format) -> Format | None:
    """``fmt`` with the level kinds that a search for an affine index needs (ordered
    coordinates, no run of repeats: ``LevelKind.searched``), when some level of ``a``
    with an affine index lacks them; None when every such level has them."""

    def searchable(f: Format) -> bool:
        return all(
            kind.full or (kind.ordered and not kind.branchless and f.unique(lvl))
            for lvl, (kind, m) in enumerate(zip(f.levels, f.mode_order, strict=True))
            if a.indices[m].single_variable is None
        )

    if searchable(fmt):
        return None
    new = fmt.with_structure(tuple(k.searched() for k in fmt.levels), fmt.maps)
    return new if searchable(new) else None


def _reordered(a: Access, fmt: Format, pos: dict[str, int]) -> Format:
    """``fmt`` with its levels in the loop order ``pos`` (the format a converted copy of
    the operand is read in)."""
    modes = sorted(range(len(a.indices)), key=lambda m: pos[a.indices[m].base(pos)])
    return fmt.with_structure(tuple(k.reordered() for k in fmt.levels), tuple(modes))


def _requantizes(a: Access, fmt: Format, pos: dict[str, int]) -> bool:
    """Whether reading ``a`` in the loop order ``pos`` would regroup its scales."""
    if fmt.values is None or fmt.values.level is None:
        return False
    return _group_level(fmt, _reordered(a, fmt, pos)) is None


def _dequantized(fmt: Format, new: Format) -> str:
    """What a note on a converted operand adds when the copy's values are dequantized."""
    if fmt.values is None or new.values is not None:
        return ""
    return (
        ", its values dequantized (no level of that order groups the elements of one of "
        "its scales, and regrouping them would requantize it)"
    )


def _group_level(fmt: Format, new: Format) -> int | None:
    """The level of ``new`` (``fmt``'s levels in another order) whose positions group
    the elements ``fmt``'s scale level does: a scale per position of level L is one
    per combination of the modes of levels 0..L. None when no level does."""
    group = set(fmt.maps[: fmt.values.level + 1])
    return next(
        (level for level in range(len(new.maps)) if set(new.maps[: level + 1]) == group), None
    )


def _regrouped(fmt: Format, new: Format) -> Format:
    """``new`` with ``fmt``'s scale groups (see ``_group_level``). When no level keeps
    them, the copy holds the operand's values dequantized, in the kernel's type:
    regrouping the scales would requantize it (change its numbers), and the copy is
    made on every call anyway."""
    values = fmt.values
    if values is None or values.level is None:
        return new
    level = _group_level(fmt, new)
    if level is None:
        return Format(new.levels, new.maps, None)
    return Format(new.levels, new.maps, replace(values, level=level))


def _violations(chain: Chain, pos: dict[str, int], strict: bool = False) -> int:
    """Adjacent levels whose base variables the order binds the wrong way round.

    ``strict`` (sparse operands) also counts two levels resolved at one loop,
    which no walk down the levels can do.
    """
    bases = [max(pos[v] for v in level) for level in chain]
    return sum(1 for a, b in zip(bases, bases[1:], strict=False) if a > b or (strict and a == b))


def _candidates(
    variables: list[str],
    chains: list[list[str]],
    first: list[str],
    needs: dict[str, set[str]] | None = None,
    output: list[str] | None = None,
):
    """All permutations when few variables, else orders from a topological sort:
    one of all the variables, one that binds ``first`` (a sparse output's appended
    variables, in its level order) before the rest, and one that binds all of
    ``output`` (the output's level variables) first, in its level order. ``needs``
    maps a nested sum's variable to those its value depends on, which a topological
    order binds first (any order that does not is refused)."""
    if len(variables) <= _MAX_EXHAUSTIVE:
        yield from itertools.permutations(variables)
        return
    needs = needs or {}
    yield _topological(variables, chains, needs)
    for lead in (first, output or []):
        lead = list(dict.fromkeys(v for v in lead if v in variables))
        rest = [v for v in variables if v not in lead]
        kept = [[v for v in c if v in rest] for c in chains]
        yield tuple(lead) + _topological(rest, kept, {v: n - set(lead) for v, n in needs.items()})


def _topological(
    variables: list[str], chains: list[list[str]], needs: dict[str, set[str]]
) -> tuple[str, ...]:
    order: list[str] = []
    remaining = list(variables)
    while remaining:

        def blocked(v: str) -> int:
            return sum(
                1
                for c in chains
                for a, b in zip(c, c[1:], strict=False)
                if b == v and a in remaining and a != v
            )

        ready = [v for v in remaining if not needs.get(v, set()) & set(remaining)]
        nxt = min(ready or remaining, key=lambda v: (blocked(v), variables.index(v)))
        order.append(nxt)
        remaining.remove(nxt)
    return tuple(order)
