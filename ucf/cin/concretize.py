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
import warnings

from ucf.cin.notation import CIN, Slot
from ucf.errors import UnsupportedError
from ucf.format.format import Format
from ucf.lang.ast import Access, Statement, accesses

_MAX_EXHAUSTIVE = 7


class ConversionWarning(UserWarning):
    """An operand is stored in a mode order no loop order can follow; ucf converts it."""


_warned: set[tuple[str, str, str]] = set()


def level_vars(access: Access, fmt: Format) -> list[str]:
    """Index variables of an access in the order its storage levels hold them."""
    return [access.indices[m].single_variable for m in fmt.mode_order]


def concretize(
    stmt: Statement,
    formats: dict[str, Format],
    output_format: Format,
    order: list[str] | None = None,
    workspace: bool = False,
) -> CIN:
    """The loop order and operand storage for a statement.

    ``workspace`` says a precompute will give the output a workspace, so a
    sparse output no longer needs its variables outside every reduction.
    """
    rhs = accesses(stmt.rhs)
    for a in [stmt.lhs, *rhs]:
        for idx in a.indices:
            if idx.single_variable is None:
                where = "the output" if a is stmt.lhs else "an operand"
                raise UnsupportedError(
                    f"access {a}: index '{idx}' of {where} is not a plain index variable; "
                    "affine and constant indices are not yet supported by the lowering"
                )
    out_vars = [i.single_variable for i in stmt.lhs.indices]
    all_vars = list(
        dict.fromkeys(out_vars + [v for a in rhs for i in a.indices for v in i.variables])
    )
    red_vars = [v for v in all_vars if v not in out_vars]

    hard: list[tuple[int, list[str]]] = []  # (access number, chain)
    soft: list[list[str]] = []
    for n, a in enumerate(rhs):
        chain = level_vars(a, formats[a.tensor])
        if formats[a.tensor].is_dense:
            soft.append(chain)
        else:
            if len(set(chain)) != len(chain):
                raise UnsupportedError(
                    f"access {a}: a repeated index variable in a sparse operand is not supported"
                )
            hard.append((n, chain))
    out_chain = level_vars(stmt.lhs, output_format)
    sparse_out = not output_format.is_dense

    def fixed_ok(perm: tuple[str, ...]) -> bool:
        if not sparse_out:
            return True
        pos = {v: k for k, v in enumerate(perm)}
        if _violations(out_chain, pos):
            return False
        return workspace or all(pos[o] < pos[r] for o in out_vars for r in red_vars)

    preference = {v: k for k, v in enumerate(all_vars)}
    if order is not None:
        best = tuple(order)
    else:
        best = None
        best_key = None
        for perm in _candidates(all_vars, [c for _, c in hard] + soft + [out_chain]):
            if not fixed_ok(perm):
                continue
            pos = {v: k for k, v in enumerate(perm)}
            key = (
                sum(1 for _, c in hard if _violations(c, pos)),
                sum(_violations(c, pos) for c in soft) + _violations(out_chain, pos),
                [preference[v] for v in perm],
            )
            if best_key is None or key < best_key:
                best, best_key = perm, key
    assert best is not None
    pos = {v: k for k, v in enumerate(best)}

    notes: list[str] = []
    slots: dict[int, Slot] = {}
    converted: dict[tuple[str, Format], str] = {}
    for n, a in enumerate(rhs):
        fmt = formats[a.tensor]
        if not fmt.is_dense and _violations(level_vars(a, fmt), pos):
            modes = sorted(range(len(a.indices)), key=lambda m: pos[a.indices[m].single_variable])
            new = Format(fmt.levels, tuple(modes))
            name = converted.setdefault((a.tensor, new), f"{a.tensor}_as{len(converted) + 1}")
            slots[n] = Slot(name, a.tensor, new)
            msg = (
                f"operand {a.tensor} is stored as '{fmt}' but no loop order follows it; "
                f"it is converted to '{new}' before each call"
            )
            notes.append(msg)
            key = (stmt.text or str(stmt), a.tensor, str(new))
            if key not in _warned:
                _warned.add(key)
                warnings.warn(f"ucf: {msg}", ConversionWarning, stacklevel=3)
        else:
            slots[n] = Slot(a.tensor, a.tensor, fmt)
    notes.insert(0, f"loop order {', '.join(best) or '(none)'}")
    return CIN(stmt, list(best), slots, output_format, notes)


def _violations(chain: list[str], pos: dict[str, int]) -> int:
    return sum(1 for a, b in zip(chain, chain[1:], strict=False) if pos[a] > pos[b])


def _candidates(variables: list[str], chains: list[list[str]]):
    """All permutations when few variables, else orders from a topological sort."""
    if len(variables) <= _MAX_EXHAUSTIVE:
        yield from itertools.permutations(variables)
        return
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

        nxt = min(remaining, key=lambda v: (blocked(v), variables.index(v)))
        order.append(nxt)
        remaining.remove(nxt)
    yield tuple(order)
