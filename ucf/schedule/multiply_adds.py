"""The work estimate the default's models share: a product's multiply-adds.

The contraction order of a chain (``contraction_order``), a sum of products' row
workspaces (``gathering``), transposed products (``transposed_products``) and the
parallel loop's grain (``parallel_loops``) each compare plans by how many multiply-adds a
product of accesses takes: the product of its variables' extents, each sparse
operand thinning it by the fraction of its entries it stores. One estimate, so the
models agree on what a plan costs.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ucf.lang.ast import Access


class Stats(Protocol):
    """What the estimate reads of a call's statistics (``ucf.schedule.stats.Stats``)."""

    extents: dict[str, int]
    nnz: dict[str, int]


def density(a: Access, stats: Stats) -> float:
    """The stored fraction of ``a``'s operand: its entries over the product of its
    indices' variables' extents (1.0 where the call does not know its entries)."""
    if a.tensor not in stats.nnz:
        return 1.0
    size = math.prod(stats.extents.get(v, 1) for i in a.indices for v in i.variables)
    return min(1.0, stats.nnz[a.tensor] / max(size, 1))


def multiply_adds(
    found: Iterable[Access], stats: Stats, sparse: Collection[str], also: Iterable[str] = ()
) -> float:
    """The multiply-adds of the product of ``found`` over its variables and ``also``
    (the output's, where the product runs inside its loops): the extents' product,
    thinned by the density of each access to a tensor in ``sparse``. Sparse accesses
    over the same variables thin it once, by the sparser one's density: their
    intersection is unknown, and the common case is one pattern twice (a masked
    product's gradient ``grad_A(i,j) * B(i,j) * D(k,j)``, where ``grad_A`` holds B's
    pattern), which a product of densities would put 1/density times too low."""
    found = list(found)
    variables = {v for a in found for i in a.indices for v in i.variables} | set(also)
    work = float(math.prod(stats.extents.get(v, 1) for v in variables))
    thinned: dict[frozenset[str], float] = {}
    for a in found:
        if a.tensor in sparse:
            over = frozenset(v for i in a.indices for v in i.variables)
            thinned[over] = min(thinned.get(over, 1.0), density(a, stats))
    return work * math.prod(thinned.values())
