"""Whether a loop order walks a tensor as stored: the one rule behind the checks that
ask it.

A sparse tensor is walked without a search or a conversion only when the loops bind
its levels' variables outer to inner: CSR's ``A(i,j)`` under ``i`` then ``j``, CSC's
under ``j`` then ``i``. A schedule's ``reorder`` is refused where it breaks that for
an operand the kernel reads as stored (``ucf.schedule.apply``); a precompute's
producer that can keep it in an order of its own walks its operands so
(``ucf.schedule.own_order``); and the tuner offers the orders that keep it for every
sparse operand (``ucf.tuning.search_problem``). All three ask ``misordered`` of each tensor's
``levels``, so they cannot drift apart.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from ucf.format.format import Format
from ucf.lang.ast import Access


def levels(a: Access, fmt: Format) -> tuple[str, ...] | None:
    """The variable of each of ``a``'s levels stored in ``fmt``, outer to inner: the
    chain a loop order must bind in turn to walk ``a`` as stored; None where an index
    is not one plain variable (an affine index is resolved at the loop of whichever of
    its variables comes last, ``ucf.cin.concretize.level_vars``, which no fixed chain
    says)."""
    names = tuple(a.indices[m].single_variable for m in fmt.mode_order)
    return None if None in names else names


def misordered(order: Sequence[str], chain: Sequence[str]) -> tuple[str, str] | None:
    """The first neighbouring levels' variables ``(outer, inner)`` of ``chain`` that the
    loop order ``order`` binds inner first, or None where it walks the chain as stored.
    Two neighbouring levels at one variable (a diagonal, ``A(i,i)``) are resolved at
    one loop and ask nothing of the order. Every variable of ``chain`` is in ``order``."""
    at = {v: k for k, v in enumerate(order)}
    return next(((a, b) for a, b in itertools.pairwise(chain) if at[a] > at[b]), None)


def walks_as_stored(order: Sequence[str], chains: Iterable[Sequence[str]]) -> bool:
    """Whether the loop order ``order`` walks every chain (``levels``) as stored."""
    return all(misordered(order, chain) is None for chain in chains)
