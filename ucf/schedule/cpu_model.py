"""The default schedule: decisions from the statement, the formats and cheap
statistics of the operands, when the user gives no schedule.

Each decision is a scheduling command plus one line saying why, so ``k.cin``
explains the kernel it got. The model proposes; ``ucf.pipeline`` checks each
proposal with the same checker a user's schedule goes through and takes the
first that passes, so a wrong guess costs a fallback, never a wrong kernel.

The statistics are what a call can see for almost nothing: every variable's
extent, each operand's number of stored entries, and how unevenly a sparse
operand's rows are filled (``ucf.schedule.stats``). Without them (compiling before
any call) the model assumes large extents and even rows.

This module puts the proposals together: workspaces, loop orders, and the decisions
of the modules it asks for each order (the parallel loop, ``parallel_loops``; the
innermost loop's bound and register tiles, ``innermost_bound``; branch-free short
fibers, far streams, copies of strided operands, unit loops, dense products).
"""

from __future__ import annotations

from dataclasses import dataclass

from ucf.cin.concretize import appended_vars
from ucf.cin.notation import CIN
from ucf.cin.scale_groups import grouped_variables
from ucf.format.format import Format
from ucf.lang.ast import Binary, Sum, accesses, text
from ucf.lang.reductions import peel
from ucf.schedule import (
    contraction_order,
    dense_gather,
    dense_products,
    far_streams,
    innermost_bound,
    parallel_loops,
    short_fibers,
    strided_operands,
    transposed_products,
    unit_loops,
)
from ucf.schedule.commands import Command, PrecomputeCommand, Reorder
from ucf.schedule.gathering import distributed, is_product, terms, workspaces
from ucf.schedule.intersections import intersected
from ucf.schedule.multiply_adds import multiply_adds
from ucf.schedule.stats import Stats

#: Below this many multiply-adds a call keeps the plan compiled before any call: a plan of
#: its own would cost a compile (a tenth of a second, once: the disk cache keeps it) to
#: save microseconds. Since parallel loops start from 1 << 14 units of work
#: (``ucf.lower.work.WORK_THRESHOLD``), calls from here up run on two threads, where
#: SpMV of 400k-500k nonzeros in uneven rows (R-MAT, arrowhead, a few dense rows) split
#: statically took 1.27-1.40x the time of chunks of rows (bench/autoschedule.py).
REPLAN_WORK = 1 << 18


@dataclass
class Choice:
    """One proposed schedule and the reason for each of its decisions."""

    commands: list[Command]
    why: list[str]

    @property
    def text(self) -> str:
        """The schedule as the language spells it (for the kernel cache's key and notes)."""
        return "; ".join(map(str, self.commands))


def propose(
    cin: CIN,
    storage_order: list[str],
    stats: Stats | None,
    threads: int,
    stored: dict[str, Format] | None = None,
) -> list[Choice]:
    """Schedules to try for ``cin`` (the concretized statement, unscheduled), best
    first. ``storage_order`` is the loop order that follows every operand's storage
    when the output may use a workspace; ``stored`` are the operands' formats as given
    (``cin`` may read some converted). The last proposal is always the plain
    loop nest, which every statement has. (A call whose work is below
    ``REPLAN_WORK`` is not asked about: see ``pays``.)"""
    ws_why: list[str] = []
    linear = transposed_products.plan(cin, stats, ws_why, stored)
    chain = [] if linear is not None else contraction_order.plan(cin, stats, ws_why)
    if linear is not None:
        plans = [(linear.commands, linear.order)]
    elif chain:
        plans = [(chain, storage_order)]
    else:
        plans = [(w, storage_order) for w in _workspaces(cin, storage_order, stats, ws_why)]
    gather = dense_gather.plan(cin, stats, ws_why) if linear is None and not chain else []
    if gather:
        plans = [(gather + w, order) for w, order in plans] or [(gather, list(cin.order))]
    choices = []
    for prefix, order in plans or [([], list(cin.order))]:
        choices += _choices(cin, order, prefix, ws_why, stats, threads)
    if plans:
        serial = parallel_loops.serial_reason(threads) or parallel_loops.NO_PARALLEL
        plain = "no workspace" if linear is None else "the plain loop order"
        choices.append(Choice([], [f"default: {plain}, since the checks refused it", serial]))
    gemm, gemm_why = dense_products.plan(cin, stats.extents if stats else None, threads)
    if gemm:
        serial = parallel_loops.serial_reason(threads)
        choices.insert(0, Choice(gemm, [*gemm_why, *([serial] if serial else [])]))
    return choices


def _choices(
    cin: CIN,
    order: list[str],
    workspace: list[Command],
    ws_why: list[str],
    stats: Stats | None,
    threads: int,
) -> list[Choice]:
    """The proposals with ``workspace`` (the commands of a workspace or a linear plan,
    or none), which leave the loops in ``order``, best first: a parallel loop in each
    place the model likes, then serial ones. Each copies the dense operands its loop
    order reads against their storage (``ucf.schedule.strided_operands``)."""

    def copied(way: list[str]) -> tuple[list[Command], list[str]]:
        why: list[str] = []
        return strided_operands.plan(cin, way, stats, why), why

    # Each order the model would like, then the one it has: integer sums inside the
    # output's loops may be refused by a blocked operand's storage (bcsr stores k_blk
    # above i_in), and the parallel loop must not depend on that.
    orders = [(order, [], [])]
    if not workspace:
        wanted = integer_order(cin, order)
        if not wanted[1]:
            wanted = dense_inside(cin, order)
            unit = unit_loops.above_reductions(cin, wanted[0], stats)
            wanted = unit if unit[1] else wanted
        if wanted[1]:
            orders.insert(0, wanted)
    order, exact, exact_why = orders[0]
    work = _work(cin, stats)
    serial = parallel_loops.serial_reason(threads)
    # A workspace over several variables is walked over them by its producer and its
    # consumer both, and ``bound`` takes one loop: it would be refused.
    spanned = {
        v
        for c in workspace
        if isinstance(c, PrecomputeCommand) and c.more
        for v in (c.var, *c.more)
    }

    def bounded(way: list[str], parallel: str | None) -> list[list[tuple[Command, str]]]:
        """The bound of ``way``'s innermost loop with its register tile, then the bound
        alone, for a tile whose reorder is refused (the gradient of an SDDMM's C at
        K = 64: ``j`` co-iterates two sparse rows and cannot move inside the tile's
        outer loop; the bound then holds the row in registers, ``ucf.passes.held_rows``).
        Empty when nothing is bounded."""
        bound = (
            [] if way and way[-1] in spanned else innermost_bound.plan(cin, way, stats, parallel)
        )
        return [bound, bound[:1]] if len(bound) > 1 else [bound] if bound else []

    choices = []
    if serial is None:
        for way, moves, moved_why in orders:
            copies, copy_why = copied(way)
            for v, reason in parallel_loops.candidates(cin, way, stats, threads):
                par, how = parallel_loops.shared_out(cin, v, stats, threads, work)
                for hoist in parallel_loops.placements(way, v, stats):
                    for bound in bounded(way, v) or [[]]:
                        cmds = [*copies, *workspace, *moves, *hoist, *[c for c, _ in bound], *par]
                        lines = [*ws_why, *copy_why, *moved_why, reason, how]
                        lines += [w for _, w in bound if w]
                        if hoist:
                            lines.append(
                                f"default: {v} moves outermost, so one parallel region runs"
                            )
                        choices.append(Choice(cmds, lines))
    serial = serial or parallel_loops.NO_PARALLEL
    copies, copy_why = copied(order)
    for bound in bounded(order, None):
        cmds = [*copies, *workspace, *exact, *[c for c, _ in bound]]
        lines = [*ws_why, *copy_why, *exact_why, serial, *[w for _, w in bound if w]]
        choices.append(Choice(cmds, lines))
    if exact:
        choices.append(Choice([*copies, *exact], [*copy_why, *exact_why, serial]))
    copies, copy_why = copied(orders[-1][0])
    choices.append(Choice([*copies, *workspace], [*ws_why, *copy_why, serial]))
    # Short fibers run branch-free, then streams gathered far apart go into the L2, in
    # every proposal, and then the last as it was.
    for extra, why in (short_fibers.plan(cin, order, stats), far_streams.plan(cin, order, stats)):
        if extra:
            more = [Choice([*c.commands, *extra], [*c.why, *why]) for c in choices]
            choices = [*more, choices[-1]]
    return choices


def pays(cin: CIN, stats: Stats | None) -> bool:
    """Whether a call with ``stats`` is worth a plan of its own (``REPLAN_WORK``); cheap,
    so a kernel asks before anything is concretized."""
    work = _work(cin, stats)
    if work is None or work >= REPLAN_WORK:
        return True
    return stats is not None and unit_loops.pays_below(cin, stats, work)


def _workspaces(
    cin: CIN, storage_order: list[str], stats: Stats | None, why: list[str]
) -> list[list[Command]]:
    """The workspace plans to try, best first (none: the plain order). Gustavson's
    workspace for a sparse output whose storage order puts a reduction outside one of
    its variables: without it the output must be appended in its own order, which
    co-iterates every output entry with the reduction (quadratic). A sum of products
    whose sums the plain order must compute for every output entry gets a row
    workspace for the same reason (``ucf.schedule.gathering``)."""
    stmt = cin.statement
    if terms(stmt.rhs) is not None:
        if list(storage_order) == list(cin.order):
            return distributed(cin, stats, why) or intersected(cin, stats, why)
        return workspaces(cin, stats, why)
    if cin.output_format.is_dense:
        return []
    summed, body = peel(stmt.rhs)
    appended = appended_vars(stmt.lhs, cin.output_format)
    pos = {v: k for k, v in enumerate(storage_order)}
    first = min((pos[r] for r in summed if r in pos), default=None)
    if first is None:
        return []
    inside = [v for v in storage_order[first:] if v in appended]
    if not inside:
        return []
    r = storage_order[first]
    if len(inside) > 1 or not is_product(body):
        why.append(
            f"default: reduction variable {r} encloses output variables "
            f"{', '.join(inside)} in storage order, but a workspace holds one variable of "
            "one product; the output is appended in its own order instead"
        )
        return []
    v = inside[0]
    why.append(
        f"default: precompute into a workspace over {v} (Gustavson), since reduction "
        f"variable {r} encloses output variable {v} of sparse output {stmt.lhs.tensor} in "
        "the order its operands are stored"
    )
    return [[PrecomputeCommand(text(body), v, v)]]


def integer_order(cin: CIN, order: list[str]) -> tuple[list[str], list[Command], list[str]]:
    """The loop order, commands and reasons that move the outer reduction inside the
    output's loops when it sums products of quantized operands whose scale groups it
    does not change: the sum of one output entry then adds int32 products and is
    rescaled once (``ucf.lower.held``). With an output variable inside the reduction
    (CSR SpMM's ``i, k, j``) the output accumulates across the reduction's iterations,
    so every product would be rescaled instead."""
    summed, body = peel(cin.statement.rhs)
    grouped = grouped_variables(body, {s.tensor: s.format for s in cin.slots.values()})
    inner = [v for v in order if v in summed]
    if grouped is None or grouped & set(summed) or order[len(order) - len(inner) :] == inner:
        return order, [], []
    new = [v for v in order if v not in summed] + inner
    why = (
        f"default: reduction {', '.join(inner)} runs inside the output's loops, so each output "
        "entry sums its quantized products in int32 and is rescaled once"
    )
    return new, [Reorder(tuple(new))], [why]


def dense_inside(cin: CIN, order: list[str]) -> tuple[list[str], list[Command], list[str]]:
    """The output's last modes moved inside the loops over sparse levels when no sparse
    operand is indexed by them (the pixels ``p, q`` of a filter-sparse convolution
    ``O(n,m,p,q) = I(n,c,p+r,q+s) * F(m,c,r,s)``): then the innermost loops run over
    contiguous output and dense input, vectorized, and each stored element of the
    sparse operand is loaded once for a whole row of them rather than once per
    output element. ``(order, commands, reasons)``; no command when nothing moves."""
    if not cin.output_format.is_dense:
        return order, [], []
    sparse = {
        v
        for n, a in enumerate(accesses(cin.statement.rhs))
        if not cin.slots[n].format.is_dense
        for i in a.indices
        for v in i.variables
    }
    if not sparse & set(order):
        return order, [], []
    last = max(order.index(v) for v in sparse if v in order)
    suffix: list[str] = []
    for v in reversed(cin.output_vars):
        if v in sparse or v in cin.nested_vars:
            break
        suffix.insert(0, v)
    moved = [v for v in suffix if order.index(v) < last]
    if not moved:
        return order, [], []
    new = [v for v in order if v not in moved] + [v for v in order if v in moved]
    loops = ", ".join(v for v in order[: last + 1] if v in sparse)
    return (
        new,
        [Reorder(tuple(new))],
        [
            f"default: {', '.join(moved)} inside the loops over sparse levels ({loops}), "
            "so the innermost loops are dense and each stored element serves a row of them"
        ],
    )


def _work(cin: CIN, stats: Stats | None) -> float | None:
    """Multiply-adds, estimated per term of the right-hand side (a sum's terms add) as
    the product of its variables' extents thinned by each sparse operand's density."""
    if stats is None:
        return None
    sparse = {cin.slots[n].tensor for n in cin.slots if not cin.slots[n].format.is_dense}
    total = 0.0
    for term in _additive_terms(peel(cin.statement.rhs)[1]):
        total += multiply_adds(accesses(term), stats, sparse, cin.output_vars)
    return total


def _additive_terms(e) -> list:
    """The terms of a sum (a single term for anything else), through nested sums."""
    while isinstance(e, Sum):
        e = e.body
    if isinstance(e, Binary) and e.op in "+-":
        return _additive_terms(e.left) + _additive_terms(e.right)
    return [e]
