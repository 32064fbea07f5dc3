"""Output loops of extent 1 at a call, moved outermost, above the reductions.

The storage order puts a dense output's last modes innermost, inside the loops over
sparse levels (``dense_inside``), where each stored element serves a row of them: CSR
SpMM's ``i, j, k``, the gradient ``grad_C(i,k) = grad_A(i,j) * D(k,j) * B(i,j)`` of an
SDDMM. When such a row holds one element (K = 1) it serves nothing, and the sum still
goes through memory: each stored element loads the output entry, adds to it and
stores it, one chain of store-to-load forwarding a whole row long. Above the
reductions the output entry is fixed while they run, so the lowering sums it in a
register: SpMV's loop. 100k rows of 10, K = 1, one thread, CPU time, load 4: 5.83 ms in
``i, j, k``, 3.40 in ``i, k, j``, scipy's ``(G∘B) Dᵀ`` 3.19. Outermost rather than just
above the reductions, the loop of one step is entered once rather than once a row: 10k
rows, load 11, 0.155 ms in ``i, k, j``, 0.122 in ``k, i, j``, scipy 0.129 (the parallel
loop stays the next one, ``i``: the model does not share out a loop of one step).

Only where every output loop then runs above every reduction: elsewhere
(``grad_D(k,j)``, j below the reduction over i) the output entry moves with the
reductions anyway, and nothing is gained.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ucf.lang.ast import accesses
from ucf.schedule.commands import Command, Reorder
from ucf.schedule.storage_order import levels, walks_as_stored

#: A call of at least this many multiply-adds with a loop of extent 1 below the outermost
#: gets a plan of its own even under ``cpu_model.REPLAN_WORK``: the plan compiled before
#: any call runs that loop with a trip count it reads at run time, at every step of the
#: loops around it, where a plan of its own bounds it away or moves it above the sums.
#: The gradients of an SDDMM at K = 1, 10k rows of 10 (100k multiply-adds), one thread,
#: CPU time, load 8: grad_C 0.447 ms -> 0.165 (scipy 0.127), grad_B 0.665 -> 0.515
#: (scipy 0.396), grad_D 0.196 -> 0.150 (scipy 0.154). The compile (a tenth of a second,
#: once: the disk cache keeps the plan) is paid back within a few hundred calls.
UNIT_REPLAN_WORK = 1 << 14

if TYPE_CHECKING:
    from ucf.cin.notation import CIN


class Stats(Protocol):
    """What the rules read of a call's statistics (``ucf.schedule.stats.Stats``)."""

    extents: dict[str, int]


def above_reductions(
    cin: CIN, order: list[str], stats: Stats | None
) -> tuple[list[str], list[Command], list[str]]:
    """The loop order, commands and reasons that move the dense output's loops of extent
    1 at this call outermost, out of the reductions, when no other output loop runs below
    one and every sparse operand is still walked as stored (``reorder`` refuses an order
    that is not, and the proposal would take ``dense_inside``'s move with it).
    ``(order, [], [])`` where nothing moves (or the extents are unknown)."""
    if stats is None or not cin.output_format.is_dense:
        return order, [], []
    outs = set(cin.output_vars)
    first = next((k for k, v in enumerate(order) if v not in outs), None)
    if first is None:
        return order, [], []
    below = [v for v in order[first:] if v in outs]
    if not below or any(
        stats.extents.get(v) != 1 or v in cin.nested_vars or v in cin.blocks for v in below
    ):
        return order, [], []
    new = [*below, *order[:first], *(v for v in order[first:] if v not in outs)]
    chains = [
        levels(a, cin.slots[n].format)
        for n, a in enumerate(accesses(cin.statement.rhs))
        if not cin.slots[n].format.is_dense
    ]
    if not walks_as_stored(new, [c for c in chains if c is not None]):
        return order, [], []  # a sparse operand stores a loop moved out below a sum's
    sums = ", ".join(v for v in order[first:] if v not in outs)
    why = (
        f"default: {', '.join(below)} (extent 1 at this call) outermost, above the reductions "
        f"over {sums}, so each output entry sums in a register"
    )
    return new, [Reorder(tuple(new))], [why]


def pays_below(cin: CIN, stats: Stats, work: float) -> bool:
    """Whether a call under ``cpu_model.REPLAN_WORK`` still gets a plan of its own: at
    least ``UNIT_REPLAN_WORK`` multiply-adds, and a loop below the outermost of extent 1,
    in a statement over no blocked format (one block of ``bcsr(32,32)``, ``i_blk`` and
    ``k_blk`` of extent 1, is the micro-kernel's business, ``ucf.passes.pairs``, which
    tests/passes/test_pairs.py checks on the plan compiled before any call)."""
    if cin.blocks or any(s.format.blocked for s in cin.slots.values()):
        return False
    inner = [v for v in list(cin.order)[1:] if v not in cin.nested_vars]
    return work >= UNIT_REPLAN_WORK and any(stats.extents.get(v) == 1 for v in inner)
