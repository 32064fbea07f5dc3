"""The default schedule's parallel loop on the CPU: which loop runs in parallel, where it
is placed, and how its iterations are shared out over the threads.

Split out of ``ucf.schedule.cpu_model``, which asks these for every loop order it
proposes: a loop over an output variable (its iterations write apart, so no races),
moved outermost when that starts fewer parallel regions, and shared out statically or
in dynamically scheduled chunks as the call's statistics say its rows are even or not
(``ucf.schedule.stats.uneven``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from ucf.cin.notation import CIN
from ucf.lang.ast import accesses
from ucf.schedule import block_rows
from ucf.schedule.commands import Command, Parallelize, Reorder, SplitCommand
from ucf.schedule.records import Parallel
from ucf.schedule.stats import Stats, skewed, uneven

#: A loop shared out over CPU threads, each iteration independent.
THREADS = Parallel("CPUThread", "NoRaces")

#: A dynamically scheduled chunk should hold about this much work, so handing it
#: out costs little next to running it.
CHUNK_WORK = 1 << 14
#: The largest chunk: beyond it, rows of uneven length no longer even out.
MAX_CHUNK = 4096
#: Rows shared out in chunks go in at least this many chunks per thread.
CHUNKS_PER_THREAD = 32
#: A parallel loop stays inside other loops only if they start at most this many regions.
MAX_REGIONS = 8

NO_PARALLEL = (
    "default: serial, since no loop over an output variable can run in parallel without races"
)


def serial_reason(threads: int) -> str | None:
    """Serial code when only one thread would run it. Small inputs need no serial
    plan: every parallel loop starts its threads only above a work threshold
    (``ucf.lower.work.work_threshold``), checked when the kernel runs."""
    if threads <= 1:
        return "default: serial, since one thread is available (ucf.set_num_threads)"
    return None


def candidates(
    cin: CIN, order: list[str], stats: Stats | None, threads: int
) -> Iterator[tuple[str, str]]:
    """Loops over output variables (their iterations write different entries, so no
    races), most iterations first among those with enough for every thread, each with
    the reason for ``k.cin``."""
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


def placements(order: list[str], v: str, stats: Stats | None) -> list[list[Command]]:
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


def shared_out(
    cin: CIN, v: str, stats: Stats | None, threads: int, work: float | None
) -> tuple[list[Command], str]:
    """The commands that run ``v`` in parallel. Rows of even length are shared out
    statically; when some row is much longer than the mean, or a static split would
    give some thread much more than its share, they go in dynamically scheduled chunks
    sized so each holds enough work and the long rows still balance. Rows that each hold
    a chunk's work go one at a time at a smaller imbalance already, unless ``block_rows``
    keeps them."""
    plain: list[Command] = [Parallelize(v, THREADS)]
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
    if not uneven(skew, share, heavy):
        return plain, static
    if heavy and not skewed(skew) and block_rows.static_rows(cin, v, stats, mine, work, threads):
        return plain, static + block_rows.WHY
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
