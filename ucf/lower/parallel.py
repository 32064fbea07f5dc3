"""``parallelize``: CPU threads and vector lanes with their race strategies, and GPU
units marked for ``ucf.lower.gpu_grid``."""

from __future__ import annotations

import os
from dataclasses import replace

from ucf.errors import ScheduleError, UcfError
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import (
    assigned,
    blocks,
    declared,
    loops,
    names,
    nodes,
    statements,
    substitute,
)
from ucf.lower.nest import Nest, arrays_named, has_load, take_entry
from ucf.schedule import Parallel


def parallelize(
    nest: Nest, label: str, par: Parallel, threaded: frozenset[str] = frozenset()
) -> None:
    """Share the loops labelled ``label`` out as ``par`` says. Where the label names a
    precompute's producer and consumer both, a side inside a loop that runs on CPU
    threads (one labelled in ``threaded``) is left to that loop's threads: the chain
    ``y = A@(B@x)``'s producer over ``j`` runs in parallel, while its consumer sums over
    ``j`` within each parallel ``i``."""
    cmd = f"parallelize({label}, {par})"
    if par.unit.startswith("GPU"):
        _mark_gpu(nest, label, par, cmd)
        return
    if par.unit == "CPUVector" and par.strategy == "Atomics":
        raise ScheduleError(
            f"{cmd}: vector lanes cannot add atomically; CPUVector takes NoRaces, IgnoreRaces "
            "or ParallelReduction"
        )
    found = nest.find_all(label, cmd)
    sides = par.unit == "CPUThread" and _sides(nest, [loop for _, _, loop in found])
    for container, k, loop in found:
        if sides and _on_threads(nest, loop, threaded):
            continue
        _parallelize_loop(nest, label, par, cmd, container, k, loop)


def _sides(nest: Nest, found: list[ir.For]) -> bool:
    """Whether ``found`` are a precompute's producer and consumer (each reads or writes
    a workspace), not one loop, nor the cases of a sum of sparse operands."""
    names = {ws.name for ws in nest.workspaces}
    return len(found) > 1 and all(arrays_named(loop) & names for loop in found)


def _on_threads(nest: Nest, loop: ir.For, threaded: frozenset[str]) -> bool:
    """Whether ``loop`` runs inside a loop shared out over CPU threads."""
    return any(
        isinstance(s[k], ir.For) and (s[k].parallel == "CPUThread" or s[k].label in threaded)
        for s, k in _path(nest.body, loop)[:-1]
    )


def _parallelize_loop(
    nest: Nest, label: str, par: Parallel, cmd: str, container: list, k: int, loop: ir.For
) -> None:
    origins = nest.prov.origins(label)
    races = _races(nest, label, loop)
    entry, k = take_entry(nest, label, container, k, loop.var)
    loop.body = [*entry, *loop.body]
    free = nest.parallel_out | nest.trailing_out
    if nest.sparse_out and (races or any(v not in free for v in origins)):
        raise ScheduleError(
            f"{cmd}: the sparse output is appended in order; it can be built in parallel only "
            "over dense output levels above its single compressed level, or below its last one"
        )
    carried = sorted(assigned(loop.body) - declared(loop.body))
    path = _path(nest.body, loop)
    sums = {v: _running_sum(path, loop, v, nest.out_vals) for v in carried}
    accs = [v for v in carried if sums[v] is not None]
    extrema = [v for v in carried if _extremum(loop.body, v)]
    if extrema:
        raise ScheduleError(
            f"{cmd}: iterations of {label} take the largest or smallest value into "
            f"{extrema[0]}; a parallel max or min reduction is not supported (parallelize a "
            "loop over an output variable)"
        )
    if races and par.strategy == "NoRaces":
        raise ScheduleError(
            f"{cmd}: {races[0]} is a reduction variable, so iterations add into the same "
            "output entries; NoRaces promises they never do (use Atomics, Temporary or "
            "ParallelReduction)"
        )
    if accs and par.strategy == "Atomics" and par.unit == "CPUThread":
        for v in accs:
            _sink(*sums[v], loop)
    elif accs and par.strategy in ("Temporary", "ParallelReduction"):
        loop.reduction = [sums[v][1].var for v in accs]
    elif accs:
        raise ScheduleError(
            f"{cmd}: iterations of {label} add into the running sum {accs[0]}; use "
            "ParallelReduction, Temporary or Atomics"
        )
    private = [ws for ws in nest.workspaces if _private(nest.body, loop, ws)]
    shared = {ws.name for ws in nest.workspaces if ws not in private}
    if races and par.strategy == "Atomics":
        # A loop inside a precompute's producer adds into the shared workspace as well.
        _atomic_stores(loop.body, {nest.out_vals} | shared)
    elif races and not accs and par.strategy in ("Temporary", "ParallelReduction"):
        written = {s.array.name for s in statements(loop.body) if isinstance(s, ir.Store)}
        into = [f"the workspace {w}" for w in sorted(written & shared)] or ["the output"]
        raise ScheduleError(
            f"{cmd}: iterations of {label} add straight into {into[0]}, not into a scalar "
            "sum; use Atomics"
        )
    ordered = _ordered(nest, label, loop, frozenset(accs))
    if ordered is not None:
        raise ScheduleError(f"{cmd}: {ordered}")
    loop.parallel = par.unit
    loop.strategy = par.strategy
    if par.unit == "CPUThread":
        for ws in private:
            _privatize(nest.body, loop, ws)
        rel = nest.prov.rel.get(label)
        if rel is not None and rel.role == "outer" and _data_dependent(loop.body):
            loop.schedule = ("dynamic", 1)


def mark_independent(nest: Nest) -> None:
    """Mark each serial loop over an output variable whose iterations are independent
    (``parallelize(..., NoRaces)``'s checks pass: ``_races``, ``_ordered``; and it fills
    no workspace that the next iteration reuses) with that strategy, though it stays
    serial. ``ucf.passes.row_groups`` then runs its rows in lock step as it does a
    parallel loop's: without this, the plan for one thread of an N:M SpMM lost its
    register tiles and ran 5x slower than the plan for two. A loop inside another
    (``y(i) = A(b,i,j) * x(j)`` over ``b, i, j``) is marked as an outermost one is:
    the rule is the loop's own, wherever it stands."""
    if nest.sparse_out:
        return
    spaces = {ws.name for ws in nest.workspaces}
    for _, s in loops(nest.body):
        if not (isinstance(s, ir.For) and s.parallel is None and s.label in nest.out_vars):
            continue
        stored = {n.array.name for n in statements(s.body) if isinstance(n, ir.Store)}
        if s.label in nest.entries or stored & spaces or _races(nest, s.label, s):
            continue
        if _ordered(nest, s.label, s) is None:
            s.strategy = "NoRaces"


def _races(nest: Nest, label: str, loop: ir.For) -> list[str]:
    """The variables ``label`` iterates whose iterations may write the same entries: all
    but the output's and, where ``loop`` is a precompute's producer, its workspace's."""
    own = nest.out_vars | _filled_by(nest, loop)
    return [v for v in nest.prov.origins(label) if v not in own]


def _ordered(
    nest: Nest, label: str, loop: ir.For, summed: frozenset[str] = frozenset()
) -> str | None:
    """Why the iterations of ``loop`` must run one after another whatever the strategy
    (the end of a ``ScheduleError`` that ``parallelize`` raises, naming ``label``), or
    None: it carries a variable from one iteration to the next (``summed``, running
    sums a strategy reduces, and the chunks of a sparse output aside), or it is
    unrolled."""
    carried = sorted(assigned(loop.body) - declared(loop.body) - summed - nest.chunked)
    if carried:
        return (
            f"the loop carries {', '.join(carried)} from one iteration to the next (a sparse "
            "iterator co-iterated with a dense dimension), so it cannot be parallelized"
        )
    if loop.unroll:
        return (
            f"{label} is also unrolled {loop.unroll} times; OpenMP takes over a parallel loop, "
            "so it cannot be unrolled too (unroll a loop inside it: split it and unroll the "
            "inner loop)"
        )
    return None


def _filled_by(nest: Nest, loop: ir.For) -> frozenset[str]:
    """The variables of the dense workspace ``loop`` fills, where it is a precompute's
    producer (it stores into that workspace and nothing else): each iteration over one
    of them writes entries of its own, so they race no more than output variables."""
    stored = {s.array.name for s in statements(loop.body) if isinstance(s, ir.Store)}
    if len(stored) != 1 or nest.out_vals in stored:
        return frozenset()
    return nest.filled.get(next(iter(stored)), frozenset())


def _mark_gpu(nest: Nest, label: str, par: Parallel, cmd: str) -> None:
    """Mark a loop for the GPU; ``ucf.lower.gpu_grid`` checks the whole nest and maps it.

    Only the CUDA target gets here (``ucf.pipeline`` refuses GPU units on the others).
    A range's setup (a fused ``pos`` loop's search) moves into each iteration, as for
    CPUThread, so a GPU thread that starts a range searches for it itself.
    """
    if nest.sparse_out:
        raise ScheduleError(f"{cmd}: target 'cuda' computes dense outputs only")
    for container, k, loop in nest.find_all(label, cmd):
        entry, k = take_entry(nest, label, container, k, loop.var)
        loop.body = [*entry, *loop.body]
        loop.parallel = par.unit
        loop.strategy = par.strategy


def _path(stmts: list[ir.Stmt], target: ir.Stmt) -> list[tuple[list[ir.Stmt], int]]:
    """The (statement list, index) pairs that lead from ``stmts`` down to ``target``."""
    for k, s in enumerate(stmts):
        if s is target:
            return [(stmts, k)]
        for block in blocks(s):
            below = _path(block, target)
            if below:
                return [(stmts, k), *below]
    return []


def _running_sum(path: list, loop: ir.For, name: str, out_vals: str):
    """``(statements, declaration, store)`` when ``name`` is a running sum that ``loop``
    feeds: declared as 0 before the statement holding the loop (directly, or through
    the other loops of a split), stored into the output once after it, and assigned by
    nothing else in between; else None."""
    for container, k in reversed(path):
        decl = next(
            (s for s in container[:k] if isinstance(s, ir.Decl) and s.var.name == name), None
        )
        if decl is None:
            continue
        stores = [
            s
            for s in container[k + 1 :]
            if isinstance(s, ir.Store)
            and s.array.name == out_vals
            and isinstance(s.value, Var)
            and s.value.name == name
        ]
        alone = _assignments([container[k]], name) == _assignments(loop.body, name)
        if _extremum(loop.body, name):
            return None  # a max or min: partial results do not add up
        if isinstance(decl.init, Const) and len(stores) == 1 and alone:
            return container, decl, stores[0]
        return None
    return None


def _extremum(stmts: list[ir.Stmt], name: str) -> bool:
    """Whether ``name`` is a running max or min (``ucf.lower.lowerer``'s leaf)."""
    return any(
        isinstance(s, ir.Assign)
        and s.var.name == name
        and isinstance(s.value, ir.Bin)
        and s.value.op in ("max", "min")
        for s in statements(stmts)
    )


def _assignments(stmts: list[ir.Stmt], name: str) -> int:
    return sum(1 for s in statements(stmts) if isinstance(s, ir.Assign) and s.var.name == name)


def _sink(container: list[ir.Stmt], decl: ir.Decl, store: ir.Store, loop: ir.For) -> None:
    """Give every iteration its own partial sum, added atomically into the output."""
    container.remove(decl)
    container.remove(store)
    loop.body = [decl, *loop.body, replace(store, accumulate=True, atomic=True)]


def _atomic_stores(stmts: list[ir.Stmt], arrays: set[str]) -> None:
    for s in statements(stmts):
        if isinstance(s, ir.Store) and s.array.name in arrays:
            s.accumulate = True
            s.atomic = True


def _private(body: list[ir.Stmt], loop: ir.For, ws: ir.Array) -> bool:
    """Whether each iteration of ``loop`` may have its own copy of workspace ``ws``: the
    loop holds every use of it (the whole ``where``), and it is allocated at the top.

    A loop inside the producer or the consumer shares the workspace with the other side,
    so it must see the one copy.
    """
    at_top = any(isinstance(s, ir.Alloc) and s.array == ws for s in body)
    inside = _uses(loop.body, ws)
    return at_top and inside > 0 and inside == _uses(body, ws)


def _uses(stmts: list[ir.Stmt], ws: ir.Array) -> int:
    """How often the statements name array ``ws``, its allocation and release aside."""
    named = sum(1 for n in nodes(stmts) if isinstance(n, ir.Array) and n.name == ws.name)
    held = sum(1 for s in statements(stmts) if isinstance(s, ir.Alloc | ir.Free) and s.array == ws)
    return named - held


def _privatize(body: list[ir.Stmt], loop: ir.For, ws: ir.Array) -> None:
    """Move a workspace's allocation into the loop's per-thread setup."""
    alloc = next(s for s in body if isinstance(s, ir.Alloc) and s.array == ws)
    free = next(s for s in body if isinstance(s, ir.Free) and s.array == ws)
    body.remove(alloc)
    body.remove(free)
    loop.prologue.append(alloc)
    loop.epilogue.append(free)


def _data_dependent(stmts: list[ir.Stmt]) -> bool:
    """Whether the work per iteration depends on the data (inner loops over sparse levels)."""
    for _, inner in loops(stmts):
        if isinstance(inner, ir.While):
            return True
        if has_load([inner.start, inner.end]):
            return True
    return False


#: Estimated work (see ``work_estimate``) below which a parallel loop runs on the calling
#: thread alone, because starting and joining threads would cost more than they save.
#: From ``bench/parallel_threshold.py`` on an idle 2-core machine (2026-11-27): two threads
#: lost to one by at most 10 % at every size (1.07-1.10 at 70 to 1e3 units, where waking
#: the second thread costs a few µs) and won from about 1e4 units (0.87 at 11e3, 0.61 at
#: 1.1e5). On a machine that other processes hold, waking a thread took 0.1 to 8 ms and
#: two threads lost to one up to 1e6 units (the constant was 1 << 20 then); set
#: ``UCF_WORK_THRESHOLD`` there. At 1 << 20 SpMV of 500k nonzeros ran on one thread, and
#: MKL's on two was 1.1-1.8x faster.
WORK_THRESHOLD = 1 << 14


def threshold() -> int:
    """``UCF_WORK_THRESHOLD`` if set (0 makes every parallel loop start its threads, as
    the tests want, to exercise them on small inputs), else WORK_THRESHOLD. It is
    compiled into the code, so the kernel cache keys on it."""
    text = os.environ.get("UCF_WORK_THRESHOLD", "").strip()
    if not text:
        return WORK_THRESHOLD
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise UcfError(f"UCF_WORK_THRESHOLD={text!r}: the work threshold is an integer >= 0")
    return value


def work_threshold(loop: ir.For) -> ir.Expr:
    """The condition under which ``loop`` runs on several threads: its estimated work
    reaches ``threshold()``. The one place a cost model tunes when parallelism pays."""
    return ir.Cmp(">=", work_estimate(loop), Const(threshold(), I64))


def add_work_thresholds(body: list[ir.Stmt]) -> None:
    """Give every CPUThread loop its threshold, once the schedule has shaped the nest."""
    for _, loop in loops(body):
        if isinstance(loop, ir.For) and loop.parallel == "CPUThread":
            loop.parallel_if = work_threshold(loop)


def work_estimate(loop: ir.For) -> ir.Expr:
    """Inner iterations the whole loop runs, as an expression of what is known before it.

    Each iteration counts the trip counts of the first loop nested in it, where those
    are known up front (a dense loop over an extent, or a split's ``min(c, ...)``, which
    counts as c). A nested loop over a compressed level below the loop's own variable
    (``pos[p] .. pos[p+1]`` with ``p`` the loop variable) counts its entries in the
    loop's whole range, ``pos[end] - pos[start]``: rows of very different lengths then
    weigh what they hold. Reading ``pos`` at the ends of the range is safe because the
    loop reads the same entries itself; an empty range counts nothing.

    A split's outer loop (blocks of rows, as the default schedule shares out skewed
    rows) counts as the loop it was split from: the blocks' trip count alone would miss
    the rows' entries and keep a large loop serial.
    """
    local = declared(loop.body) | {loop.var.name}
    # Arrays the loop allocates (per-thread workspaces) do not exist before it either.
    local |= {
        s.array.name for s in statements([*loop.prologue, *loop.body]) if isinstance(s, ir.Alloc)
    }
    loop = _unsplit(loop) or loop
    local |= {loop.var.name}
    trips = _span(loop.start, loop.end)
    work: ir.Expr = _times(trips, _weight(loop.body, local))
    inner = _compressed_child(loop)
    across = None if inner is not None else _across_dense(loop, local)
    if inner is not None:
        pos, child = inner
        work = ir.Bin("+", trips, _below(pos, child, loop.start, loop.end, local))
    elif across is not None:
        passes, (pos, child) = across
        below = _below(pos, child, loop.start, loop.end, local)
        work = ir.Bin("+", trips, ir.Bin("*", passes, below))
    else:
        for pos in _merged_levels(loop):
            work = ir.Bin("+", work, _entries(pos, loop.start, loop.end))
    return work


def _unsplit(outer: ir.For) -> ir.For | None:
    """The loop that ``strip_mine`` split into ``outer`` and the block loop in it, over
    the whole range again; None unless ``outer`` has that shape (its body declares
    ``base = lo + outer * chunk``, then only values, then runs ``inner`` over
    ``min(chunk, hi - base)``, whose body first declares ``x = base + inner``)."""
    body = outer.body
    if len(body) < 2 or not isinstance(body[0], ir.Decl) or not isinstance(body[-1], ir.For):
        return None
    if not all(isinstance(s, ir.Decl) for s in body[1:-1]):
        return None
    base, inner = body[0], body[-1]
    start = base.init
    if not (isinstance(start, ir.Bin) and start.op == "+" and _steps(start.right, outer.var)):
        return None
    end = inner.end
    if not (
        isinstance(end, ir.Bin)
        and end.op == "min"
        and isinstance(end.right, ir.Bin)
        and end.right.op == "-"
        and end.right.right == base.var
        and inner.start == Const(0, I64)
        and inner.body
        and isinstance(inner.body[0], ir.Decl)
        and inner.body[0].init == ir.Bin("+", base.var, inner.var)
    ):
        return None
    return ir.For(inner.body[0].var, start.left, end.right.left, inner.body[1:])


def _steps(e: ir.Expr, var: Var) -> bool:
    """Whether ``e`` is ``var`` or ``var`` times something: a block's offset."""
    return e == var or (isinstance(e, ir.Bin) and e.op == "*" and e.left == var)


def _weight(stmts: list[ir.Stmt], local: set[str]) -> ir.Expr | None:
    """Iterations of the first loop in ``stmts`` and of the first loop in it, and so on,
    while their trip counts are known before the parallel loop; None for none.

    A loop over a range known up front whose first inner loop runs over a compressed
    level below it (``X(t,d) * W(d,h)`` with ``W`` in CSR, parallel over ``t``: each
    ``t`` walks every stored entry of ``W``) counts its own trips plus the entries in
    its whole range, as the parallel loop itself does with a compressed child."""
    for s in stmts:
        if not isinstance(s, ir.For):
            continue
        trips = _known_trips(s, local)
        if trips is None:
            return None
        inner = _compressed_child(s)
        span = _span(s.start, s.end)
        if inner is None or inner[0].name in local or has_load(span) or names(span) & local:
            return _times(trips, _weight(s.body, local))
        pos, child = inner
        return ir.Bin("+", span, _below(pos, child, s.start, s.end, local))
    return None


def _below(pos: ir.Array, child: ir.For, start: ir.Expr, end: ir.Expr, local: set[str]) -> ir.Expr:
    """The work under parent positions ``start .. end`` of a compressed level (``pos``,
    walked by ``child``): its entries, and where ``child`` first walks a compressed level
    of its own, that level's entries under them, and so on down; the deepest level's
    entries times the known trips of the loops under it. A filter-sparse convolution
    (F in UCCC, parallel over m) does its multiply-adds under F's last level, 10-50x the
    first level's entries, and counting only those kept it on one thread."""
    deeper = _compressed_child(child)
    if deeper is None:
        return _times(_entries(pos, start, end), _weight(child.body, local))
    grand_pos, grand = deeper
    first, last = (_as_i64(ir.Load(pos, at)) for at in (start, end))
    return _entries(pos, start, end, _below(grand_pos, grand, first, last, local))


def _entries(pos: ir.Array, start: ir.Expr, end: ir.Expr, under: ir.Expr | None = None) -> ir.Expr:
    """The entries a compressed level holds below positions ``start .. end`` of its
    parent, ``pos[end] - pos[start]`` (plus ``under``, the work below them); 0 for an
    empty range, whose end need not be a valid position."""
    count = ir.Bin("-", _as_i64(ir.Load(pos, end)), _as_i64(ir.Load(pos, start)))
    if under is not None:
        count = ir.Bin("+", count, under)
    return ir.Select(ir.Cmp(">", _span(start, end), Const(0, I64)), count, Const(0, I64))


def _known_trips(loop: ir.For, local: set[str]) -> ir.Expr | None:
    """The loop's trip count, or a bound on it, from what is known before the parallel
    loop: a split's ``min(c, ...)`` counts c, and a loop clipped at both ends,
    ``max(0, ...) .. min(n, ...)`` (an affine access kept inside its tensor), counts n."""
    clipped = loop.start == Const(0, I64) or (
        isinstance(loop.start, ir.Bin)
        and loop.start.op == "max"
        and Const(0, I64) in (loop.start.left, loop.start.right)
    )
    if isinstance(loop.end, ir.Bin) and loop.end.op == "min" and clipped:
        for side in (loop.end.left, loop.end.right):
            if isinstance(side, Const):
                return side
        for side in (loop.end.left, loop.end.right):
            if not has_load(side) and not names(side) & local:
                return side
    span = _span(loop.start, loop.end)
    if has_load(span) or names(span) & local:
        return None
    return span


def _span(start: ir.Expr, end: ir.Expr) -> ir.Expr:
    if start == Const(0, I64):
        return end
    if isinstance(end, ir.Bin) and end.op == "+" and end.left == start:
        return end.right  # a fixed-width segment: start .. start + w
    return ir.Bin("-", end, start)


def _times(a: ir.Expr, b: ir.Expr | None) -> ir.Expr:
    return a if b is None else ir.Bin("*", a, b)


def _as_i64(e: ir.Expr) -> ir.Expr:
    return e if e.type == I64 else ir.Cast(e, I64)


def _across_dense(loop: ir.For, local: set[str]) -> tuple[ir.Expr, tuple] | None:
    """A loop over a range known before ``loop`` that stands between it and the
    compressed level below its variable, with the trips of that loop: the outer loop of
    a split of an output variable moved above the row, as the register tile of SpMM
    (``bound(k, kb, 32, MaxExact); split(kb, kt, kr, 16); reorder(i, kt, j, kr)``) does.
    Each of its iterations walks the row again. Counting the rows alone kept such a
    kernel on one thread: 4.4 ms where 2 threads take 2.4."""
    alias: dict[str, ir.Expr] = {}
    for s in loop.body:
        if isinstance(s, ir.Decl):
            alias[s.var.name] = s.init
            continue
        if not isinstance(s, ir.For):
            return None
        known = {k: v for k, v in alias.items() if not has_load(v) and not names(v) & local}
        bounds = replace(s, start=substitute(s.start, known), end=substitute(s.end, known))
        trips = _known_trips(bounds, local)
        found = _compressed_child(s, loop.var, alias)
        return None if trips is None or found is None else (trips, found)
    return None


def _compressed_child(
    loop: ir.For, var: Var | None = None, outer: dict[str, ir.Expr] | None = None
) -> tuple[ir.Array, ir.For] | None:
    """The first loop directly in ``loop``'s body that runs over ``pos[p] .. pos[p+1]``
    where ``p`` is ``var`` (by default ``loop``'s variable), directly or through
    declarations before it (and ``outer``'s, the enclosing body's)."""
    var = var or loop.var
    alias: dict[str, ir.Expr] = dict(outer or {})
    for s in loop.body:
        if isinstance(s, ir.Decl):
            alias[s.var.name] = s.init
            continue
        if not isinstance(s, ir.For):
            continue
        lo, hi = _strip_cast(s.start), _strip_cast(s.end)
        if not (isinstance(lo, ir.Load) and isinstance(hi, ir.Load) and lo.array == hi.array):
            return None
        if hi.index != ir.Bin("+", lo.index, Const(1, I64)):
            return None
        return (lo.array, s) if _resolved(lo.index, alias) == var else None
    return None


def _merged_levels(loop: ir.For) -> list[ir.Array]:
    """The ``pos`` arrays of the compressed levels that a co-iteration ``while`` in
    ``loop``'s body merges below the loop's variable (``pA1 = A1_pos[i]``, ``pA1_end =
    A1_pos[i + 1]``, and B's likewise, for ``A(i,j) + B(i,j)``): each row's merge steps
    through the entries of all of them, so a sparse add of long rows is not counted as
    its rows alone. Empty when the body runs no ``while``."""
    if not any(isinstance(s, ir.While) for s in loop.body):
        return []
    alias: dict[str, ir.Expr] = {}
    starts: dict[str, ir.Expr] = {}
    merged: list[ir.Array] = []
    for s in loop.body:
        if not isinstance(s, ir.Decl):
            continue
        alias[s.var.name] = s.init
        load = _strip_cast(s.init)
        if not isinstance(load, ir.Load):
            continue
        if _resolved(load.index, alias) == loop.var:
            starts[load.array.name] = load.index
        elif starts.get(load.array.name) is not None and load.index == ir.Bin(
            "+", starts[load.array.name], Const(1, I64)
        ):
            merged.append(load.array)
    return merged


def _resolved(p: ir.Expr, alias: dict[str, ir.Expr]) -> ir.Expr:
    """``p`` through the declarations of the loop body before it (``pA0 = i``)."""
    while isinstance(p, Var) and p.name in alias:
        p = alias[p.name]
    return p


def _strip_cast(e: ir.Expr) -> ir.Expr:
    return e.operand if isinstance(e, ir.Cast) else e
