"""``parallelize``: CPU threads and vector lanes with their race strategies, and GPU
units marked for ``ucf.lower.gpu_grid``."""

from __future__ import annotations

from dataclasses import replace

from ucf.errors import ScheduleError
from ucf.ir import nodes as ir
from ucf.ir.nodes import Const, Var
from ucf.ir.walk import (
    assigned,
    blocks,
    declared,
    loops,
    nodes,
    statements,
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
