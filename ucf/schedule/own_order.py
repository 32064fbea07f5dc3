"""Producers that walk their sparse operands as stored, in a loop order of their own.

``y(i) = A(i,j)*x(j) + A(j,i)*x(j)`` with A in CSR reads A by rows in one term and by
columns in the other: no one loop order walks both as stored, so the plain nest
converts A on every call. Precomputed into dense workspaces over the whole range of
``i`` (``precompute(A(i,j)*x(j), i, i, v); precompute(A(j,i)*x(j), i, i, w)``), each
term has a nest of its own that shares no loop with the rest: the second one may
run ``j`` outside ``i``, walking A's rows and scattering ``A(j,i)*x(j)`` into ``w(i)``,
as scipy's ``a.T @ x`` runs a CSC product on CSR's arrays. The sum into each entry of
the workspace keeps the order of ``j`` either way.

``walked`` picks the accesses such a producer walks as stored (the loop order then
binds them no more, and nothing is converted); the lowerer (``ucf.lower.placement``)
orders the producer's loops to follow them and refuses a placement where loops it
shares with the rest of the nest would not. What "walks as stored" means is
``ucf.schedule.storage_order``'s rule.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

from ucf.format.format import Format
from ucf.lang.ast import Access, Statement, accesses
from ucf.schedule.provenance import Provenance
from ucf.schedule.records import Precompute
from ucf.schedule.storage_order import levels, walks_as_stored


def walked(
    stmt: Statement,
    precomputes: Sequence[Precompute],
    prov: Provenance,
    order: Sequence[str],
    formats: dict[str, Format],
    dense_output: bool,
) -> dict[int, str]:
    """The access numbers (left to right on the right-hand side) that a precompute's
    producer walks as stored in a loop order of its own, each with the workspace's
    name: sparse accesses that ``order`` walks out of level order, in a precompute
    over one plain variable into a dense workspace (a dense output), whose term shares
    no variable but the workspace's with the output and with the terms no precompute
    gathers, and whose sparse accesses one loop order walks all as stored."""
    if not dense_output or not precomputes:
        return {}
    rhs = accesses(stmt.rhs)
    texts = Counter(str(a) for a in rhs)
    gathered = {str(a) for pc in precomputes for a in accesses(pc.statement.rhs)}
    rest = {v for a in rhs if str(a) not in gathered for i in a.indices for v in i.variables} | {
        i.single_variable for i in stmt.lhs.indices
    }
    pos = {v: k for k, v in enumerate(order)}
    found: dict[int, str] = {}
    for pc in precomputes:
        if pc.more or pc.wvar != pc.var or pc.var in prov.rel:
            continue
        own = accesses(pc.statement.rhs)
        used = {v for a in own for i in a.indices for v in i.variables}
        # an earlier workspace (``w(k)``) is dense and no operand
        sparse = [a for a in own if a.tensor in formats and not formats[a.tensor].is_dense]
        if (used & rest) - {pc.var} or any(texts[str(a)] != 1 for a in sparse):
            continue
        if not all(_plain(a, pos) for a in sparse):
            continue  # an affine or repeated index, a variable the loops do not bind
        if walks_as_stored(order, [levels(a, formats[a.tensor]) for a in sparse]):
            continue
        if follows(sparse, formats, sorted(used, key=pos.__getitem__)) is None:
            continue
        for a in sparse:
            n = next(n for n, b in enumerate(rhs) if str(b) == str(a))
            found[n] = pc.name
    return found


def follows(
    sparse: Sequence[Access], formats: dict[str, Format], variables: Sequence[str]
) -> tuple[str, ...] | None:
    """The order of ``variables`` (the first in their given order that does) that walks
    every access of ``sparse`` as stored (``walks_as_stored``), or None, also where an
    index is not a plain variable."""
    chains = [levels(a, formats[a.tensor]) for a in sparse]
    if None in chains:
        return None
    perms = itertools.permutations(variables)
    return next((perm for perm in perms if walks_as_stored(perm, chains)), None)


def _plain(a: Access, pos: dict[str, int]) -> bool:
    """Whether every index of ``a`` is its own variable, one the loop order binds."""
    names = [i.single_variable for i in a.indices]
    return None not in names and len(set(names)) == len(names) and set(names) <= set(pos)
