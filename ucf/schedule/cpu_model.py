"""The default schedule: decisions from the statement, the formats and cheap
statistics of the operands, when the user gives no schedule.

Each decision is a scheduling command plus one line saying why, so ``k.cin`` explains
the kernel it got. The model proposes; ``ucf.pipeline`` checks each proposal with the
same checker a user's schedule goes through and takes the first that passes, so a wrong
guess costs a fallback, never a wrong kernel.

The statistics are what a call can see for almost nothing: every variable's extent, each
operand's number of stored entries, and how unevenly a sparse operand's rows are filled.
Without them (compiling before any call) the model assumes large extents and even rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ucf.cin.concretize import appended_vars
from ucf.cin.notation import CIN
from ucf.cin.scale_groups import grouped_variables
from ucf.format.format import Format
from ucf.lang.ast import Binary, Sum, accesses, text
from ucf.lang.reductions import peel
from ucf.schedule import (
    block_rows,
    contraction_order,
    dense_gather,
    dense_products,
    far_streams,
    short_fibers,
    strided_operands,
    transposed_products,
    unit_loops,
)
from ucf.schedule.commands import (
    BoundCommand,
    Command,
    Parallelize,
    PrecomputeCommand,
    Reorder,
    SplitCommand,
)
from ucf.schedule.gathering import distributed, is_product, terms, workspaces
from ucf.schedule.intersections import intersected
from ucf.schedule.multiply_adds import multiply_adds
from ucf.schedule.records import Parallel

#: A loop shared out over CPU threads, each iteration independent.
THREADS = Parallel("CPUThread", "NoRaces")

#: A dynamically scheduled chunk should hold about this much work, so handing it
#: out costs little next to running it.
CHUNK_WORK = 1 << 14
#: The largest chunk: beyond it, rows of uneven length no longer even out.
MAX_CHUNK = 4096
#: Below this many multiply-adds a call keeps the plan compiled before any call: a plan of
#: its own would cost a compile (a tenth of a second, once: the disk cache keeps it) to
#: save microseconds. Since parallel loops start from 1 << 14 units of work
#: (``ucf.lower.work.WORK_THRESHOLD``), calls from here up run on two threads, where
#: SpMV of 400k-500k nonzeros in uneven rows (R-MAT, arrowhead, a few dense rows) split
#: statically took 1.27-1.40x the time of chunks of rows (bench/autoschedule.py).
REPLAN_WORK = 1 << 18
#: Rows are shared out in chunks only when some row is this many times the mean...
SKEWED = 4.0
#: ... or a static split would give some thread this many times its share of entries...
BALANCED = 1.1
#: ... or this many times, when every row holds CHUNK_WORK (a block row of bcsr SpMM):
#: handing out rows one at a time then costs nothing next to running them.
HEAVY_BALANCED = 1.02
#: ... and then in at least this many chunks per thread.
CHUNKS_PER_THREAD = 32
#: The thread counts the imbalance is measured for (2 to this); more threads read this one.
MAX_SHARES = 64
#: A parallel loop stays inside other loops only if they start at most this many regions.
MAX_REGIONS = 8
#: The innermost dense loop is bounded (a constant trip count the compiler can unroll and
#: vectorize) up to this extent.
MAX_BOUND = 256
#: A bounded output loop wider than the largest of these runs in register tiles of the
#: largest that divides its extent, each tile's outer loop moved above the reductions, so
#: the output's tile stays in registers across them (SpMM with N = 128: 41.7 ms a call
#: untiled, 18.5 ms in tiles of 32, on one Zen 5 thread; N = 48: 11.7 ms, 6.9 in tiles
#: of 16). A row of 32 float64 fits the registers whole.
TILES = (32, 16)
#: Under two or more reductions (MTTKRP's k, l) the tiles hold 16 from 32 on: each step
#: also holds a tile of the inner product (B*C), and tiles of 32 ran no faster than the
#: untiled row (MTTKRP R = 64 on the headroom suite's tensors, 2 threads: tiles of 16
#: 1.3-2.3x faster than the untiled row on three of four, 5 % slower on the fourth).
NESTED_TILE = 16
#: Entries per row of a fixed-width operand (``ell(w)``, ``nm(n,m)``) from which the bounded loop
#: takes no register tiles and its rows run in groups instead (``ucf.passes.row_groups``, which
#: needs the plain order): a tile of one row adds the row's entries in one chain of dependent
#: multiply-adds per vector, which the core overlaps with the next tile's only while the chain is
#: short. One Zen 5 thread, float32: N:M SpMM 2000 x 512 (256 entries a row) by 32 to 256 columns
#: ran 5-6x faster in groups (N = 256: 18.5 ms in tiles, 3.6 in groups); ELL(16) by 64 to 256
#: columns 1.3x faster in groups, but 1.4x slower in float64 at 256 columns.
LONG_ROW = 64


@dataclass(frozen=True)
class Stats:
    """What a call knows about its operands before running: extents per index
    variable, stored entries per operand, and per sparse operand the longest
    row over the mean row (1.0 for even rows) and, for 2, 3, ... ``MAX_SHARES``
    threads, the largest share of its entries a static split of its rows gives
    one thread over the mean share (``ucf.schedule.stats.segments``). ``fibers``: per
    sparse operand whose last level is segmented, its segments (the fibers a loop over
    that level visits, empty ones included where a level above is dense, none that
    is not stored) where the kernel reads it as stored; ``itemsize``: per operand, the
    bytes of one value as the kernel reads it (``ucf.schedule.short_fibers`` reads both);
    ``gathers``: per matrix read as stored, how far its entries lie from the diagonal
    and over how many columns (``ucf.schedule.stats.gathers``, read by
    ``ucf.schedule.far_streams``)."""

    extents: dict[str, int]
    nnz: dict[str, int] = field(default_factory=dict)
    spread: dict[str, float] = field(default_factory=dict)
    imbalance: dict[str, tuple[float, ...]] = field(default_factory=dict)
    fibers: dict[str, int] = field(default_factory=dict)
    itemsize: dict[str, int] = field(default_factory=dict)
    gathers: dict[str, tuple[float, float]] = field(default_factory=dict)

    def share(self, tensor: str, threads: int) -> float:
        """The imbalance of ``tensor`` split statically over ``threads`` (1.0 unknown)."""
        shares = self.imbalance.get(tensor, ())
        if threads < 2 or not shares:
            return 1.0
        return shares[min(threads, MAX_SHARES) - 2]

    def key(self, threads: int) -> tuple:
        """The statistics as far as the model looks at them: calls with the same key
        get the same schedule."""
        return (
            threads,
            tuple(sorted(self.extents.items())),
            tuple(sorted((t, max(n, 1).bit_length()) for t, n in self.nnz.items())),
            tuple(sorted((t, s > SKEWED) for t, s in self.spread.items())),
            tuple(
                sorted(
                    (t, *(self.share(t, threads) > b for b in (BALANCED, block_rows.SHARE)))
                    for t in self.imbalance
                    if self.share(t, threads) > HEAVY_BALANCED
                )
            ),
            tuple(sorted(self.itemsize.items())),
            tuple(sorted((t, short_fibers.short(self, t)) for t in self.fibers)),
            tuple(sorted((t, *(int(g).bit_length() for g in v)) for t, v in self.gathers.items())),
        )


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
        serial = _serial_reason(threads) or _NO_PARALLEL
        plain = "no workspace" if linear is None else "the plain loop order"
        choices.append(Choice([], [f"default: {plain}, since the checks refused it", serial]))
    gemm, gemm_why = dense_products.plan(cin, stats.extents if stats else None, threads)
    if gemm:
        serial = _serial_reason(threads)
        choices.insert(0, Choice(gemm, [*gemm_why, *([serial] if serial else [])]))
    return choices


_NO_PARALLEL = (
    "default: serial, since no loop over an output variable can run in parallel without races"
)


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
    serial = _serial_reason(threads)
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
        bound = [] if way and way[-1] in spanned else _bound(cin, way, stats, parallel)
        return [bound, bound[:1]] if len(bound) > 1 else [bound] if bound else []

    choices = []
    if serial is None:
        for way, moves, moved_why in orders:
            copies, copy_why = copied(way)
            for v, reason in _parallel_loops(cin, way, stats, threads):
                par, how = _parallel(cin, v, stats, threads, work)
                for hoist in _placements(way, v, stats):
                    for bound in bounded(way, v) or [[]]:
                        cmds = [*copies, *workspace, *moves, *hoist, *[c for c, _ in bound], *par]
                        lines = [*ws_why, *copy_why, *moved_why, reason, how]
                        lines += [w for _, w in bound if w]
                        if hoist:
                            lines.append(
                                f"default: {v} moves outermost, so one parallel region runs"
                            )
                        choices.append(Choice(cmds, lines))
    serial = serial or _NO_PARALLEL
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


def _placements(order: list[str], v: str, stats: Stats | None) -> list[list[Command]]:
    """Where the parallel loop ``v`` may run: moved outermost if the checker allows,
    else in place when the loops around it run so few times that starting a parallel
    region in each costs little. In place when they run once (a batch of 1): moving
    ``v`` out gains nothing, and would put that loop between ``v`` and the compressed
    level below it, whose entries the runtime work threshold counts
    (``ucf.lower.work.work_estimate``)."""
    if order[0] == v:
        return [[]]
    outside = order[: order.index(v)]
    regions = math.prod(stats.extents.get(w, 1) for w in outside) if stats else None
    if regions == 1:
        return [[]]
    hoist = [Reorder((v, order[0]))]
    return [hoist, []] if regions is not None and regions <= MAX_REGIONS else [hoist]


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


def _serial_reason(threads: int) -> str | None:
    """Serial code when only one thread would run it. Small inputs need no serial
    plan: every parallel loop starts its threads only above a work threshold
    (``ucf.lower.work.work_threshold``), checked when the kernel runs."""
    if threads <= 1:
        return "default: serial, since one thread is available (ucf.set_num_threads)"
    return None


def _parallel_loops(cin: CIN, order: list[str], stats: Stats | None, threads: int):
    """Loops over output variables (their iterations write different entries, so no
    races), most iterations first among those with enough for every thread."""
    out = set(cin.output_vars)
    nested = cin.nested_vars
    loops = [v for v in order if v in out and v not in nested]
    if stats is None:
        for v in loops[:1]:
            yield v, f"default: parallel loop {v}, the outermost loop over an output variable"
        return
    ext = stats.extents
    enough = [v for v in loops if ext.get(v, 0) >= 4 * threads]
    if enough:
        v = enough[0]
        skipped = loops[: loops.index(v)]
        note = f" ({', '.join(f'{w} has {ext[w]}' for w in skipped)})" if skipped else ""
        yield (
            v,
            f"default: parallel loop {v}: {ext[v]} iterations, at least 4 per thread "
            f"of {threads}, the outermost such loop{note}",
        )
        return
    best = max(loops, key=lambda w: ext.get(w, 0), default=None)
    if best is not None and ext.get(best, 0) > 1:
        yield (
            best,
            f"default: parallel loop {best}: {ext[best]} iterations, the most of any loop "
            "over an output variable",
        )


def _parallel(cin: CIN, v: str, stats: Stats | None, threads: int, work: float | None):
    """The commands that run ``v`` in parallel. Rows of even length are shared out
    statically; when some row is much longer than the mean, or a static split would give
    some thread much more than its share, they go in dynamically scheduled chunks sized so
    each holds enough work and the long rows still balance. Rows that each hold a chunk's
    work go one at a time at a smaller imbalance already, unless ``block_rows`` keeps them."""
    plain = [Parallelize(v, THREADS)]
    if stats is None or work is None:
        return plain, f"default: {v} is shared out statically (extents are unknown before a call)"
    rows = max(stats.extents.get(v, 1), 1)
    mine = [t for t in {*stats.spread, *stats.imbalance} if _rows_of(cin, t) == v]
    skew = max((stats.spread.get(t, 1.0) for t in mine), default=1.0)
    share = max((stats.share(t, threads) for t in mine), default=1.0)
    static = (
        f"default: {v} is shared out statically ({rows} iterations; threads start only "
        "if the work reaches the threshold)"
    )
    per_row = max(work / rows, 1.0)
    heavy = per_row >= CHUNK_WORK
    kept = heavy and block_rows.static_rows(cin, v, stats, mine, work, threads)
    if skew <= SKEWED and (share <= (HEAVY_BALANCED if heavy else BALANCED) or kept):
        return plain, static + (block_rows.WHY if kept and share > HEAVY_BALANCED else "")
    chunk = min(CHUNK_WORK / per_row, rows / (CHUNKS_PER_THREAD * threads), MAX_CHUNK)
    chunk = 1 << max(int(math.log2(max(chunk, 1.0))), 0)
    if chunk <= 1 and rows <= 64 * threads and not heavy:
        return plain, static
    outer, inner = f"{v}_c", f"{v}_r"
    return (
        [SplitCommand(v, outer, inner, chunk), Parallelize(outer, THREADS)],
        f"default: {v} in dynamically scheduled chunks of {chunk} (rows are up to "
        f"{skew:.0f}x the mean length, and a static split gives one of {threads} threads "
        f"{share:.2f}x its share; about {per_row:.0f} multiply-adds per iteration)",
    )


def _rows_of(cin: CIN, tensor: str) -> str | None:
    """The variable of ``tensor``'s first stored level, whose segments the spread is of."""
    for n, a in enumerate(accesses(cin.statement.rhs)):
        fmt = cin.slots[n].format
        if a.tensor == tensor and not fmt.is_dense:
            return a.indices[fmt.mode_order[0]].single_variable
    return None


def _bound(cin: CIN, order: list[str], stats: Stats | None, parallel: str | None):
    """``bound`` on the innermost loop when it is dense over every operand and its
    extent is small and known: a constant trip count unrolls and vectorizes."""
    if stats is None or not order:
        return []
    v = order[-1]
    n = stats.extents.get(v, 0)
    # A block's places have a constant extent already, clipped at a partial block; a
    # bound would run them over the padding.
    if v == parallel or v in cin.nested_vars or v in cin.blocks or not 1 <= n <= MAX_BOUND:
        return []
    # A sum over the innermost loop runs in partial sums (``ucf.passes.partial_sums``),
    # which a constant trip count would keep in one chain: SDDMM's dot over k ran 2.5x
    # slower bounded. A loop of one step has no chain to keep, and bounded it is gone
    # (the gradient of an SDDMM's B at K = 1: 7.37 ms bounded, 7.97 not, 100k rows).
    if n > 1 and not any(v in idx.variables for idx in cin.statement.lhs.indices):
        return []
    for k, a in enumerate(accesses(cin.statement.rhs)):
        fmt = cin.slots[k].format
        for m, idx in enumerate(a.indices):
            if v in idx.variables and (
                idx.single_variable != v or not fmt.levels[fmt.level_of_mode(m)].full
            ):
                return []
    return [
        (
            BoundCommand(v, f"{v}_b", n),
            f"default: bound({v}) to {n}, the innermost loop's extent at this call, so its "
            "trip count is a constant",
        ),
        *([] if _long_fixed_rows(cin, stats) else _register_tile(cin, order, f"{v}_b", n)),
    ]


def _long_fixed_rows(cin: CIN, stats: Stats) -> bool:
    """Whether a fixed-width operand stores at least ``LONG_ROW`` entries a row (its
    entries over the extent of its first stored mode's variable)."""
    for k, a in enumerate(accesses(cin.statement.rhs)):
        slot = cin.slots[k]
        if not slot.format.fixed_width:
            continue
        row = a.indices[slot.format.mode_order[0]].single_variable
        rows = stats.extents.get(row, 0) if row else 0
        if rows and stats.nnz.get(slot.tensor, 0) >= LONG_ROW * rows:
            return True
    return False


def _register_tile(cin: CIN, order: list[str], vb: str, n: int) -> list[tuple[Command, str]]:
    """Register tiles of the bounded innermost output loop ``vb`` (extent ``n``) where the
    order is output loops, then reductions, then it (SpMM's i, j, k; MTTKRP's i, k, l, j):
    each tile's outer loop runs above the reductions, so the reductions add into one
    tile of the output held in registers instead of loading and storing a whole row of
    it at every step."""
    outs = set(cin.output_vars)
    first = next((k for k, w in enumerate(order) if w not in outs), None)
    if first in (None, 0) or any(w in outs for w in order[first:-1]):
        return []
    if len(order) - 1 - first > 1:
        tile = NESTED_TILE if n % NESTED_TILE == 0 and n >= 2 * NESTED_TILE else None
    else:
        tile = next((t for t in TILES if n % t == 0), None) if n > TILES[0] else None
    if tile is None:
        return []
    t, r = f"{vb}_t", f"{vb}_r"
    new = (*order[:first], t, *order[first:-1], r)
    return [
        (
            SplitCommand(vb, t, r, tile),
            f"default: {order[-1]} runs in register tiles of {tile} ({t} above the "
            f"reductions over {', '.join(order[first:-1])}), so each tile of the output "
            "stays in registers while they add into it",
        ),
        (Reorder(new), ""),
    ]
