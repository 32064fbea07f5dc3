"""How a GPU group's lanes take the iterations of the group loop (``ucf.lower.gpu_grid``
binds the other GPU loops; this is the group's share of the mapping). A lane runs
one iteration, bound to it, or, when the loop is wider than the group, a share of
them: strided for coalesced loads, or consecutive with a private partial sum per run
of equal destinations (``Segment``). Out-of-range iterations are guarded, or inside
the group predicated (``ucf.lower.gpu_predication``), so that every lane reaches
each collective."""

from __future__ import annotations

from dataclasses import replace

from ucf.ir import nodes as ir
from ucf.ir.gpu_nodes import GROUP_CALLS
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import assigned, blocks, declared, names, statements
from ucf.lower.gpu_bounds import fold_constant
from ucf.lower.gpu_loops import GpuLoop, is_gpu, several_entries
from ucf.lower.gpu_predication import Predicator, collective


def _extended(
    group: GpuLoop, by_id: dict[int, GpuLoop], span: int, defs: dict[str, ir.Expr]
) -> list[ir.Stmt]:
    """The group loop's body for the iteration a lane is bound to, when the lanes take
    ``span`` iterations together: out-of-range iterations are guarded, and inside the
    group they are predicated instead, so that every lane reaches each collective."""
    loop = group.loop
    guard = _guard(group, span, defs)
    if not any(collective(s) for s in loop.body):
        return loop.body if guard is None else [ir.If(guard, loop.body)]
    variant = {loop.var.name} | assigned(loop.body)
    return Predicator(variant, by_id, group).block(loop.body, guard)


def _guard(group: GpuLoop, span: int, defs: dict[str, ir.Expr]) -> ir.Expr | None:
    """The test that an iteration is in range, unless the loop has ``span`` of them."""
    loop = group.loop
    full = fold_constant(ir.sub(loop.end, loop.start), defs)
    return None if full is not None and full >= span else ir.Cmp("<", loop.var, loop.end)


def share_iterations(group: GpuLoop, by_id: dict[int, GpuLoop], defs: dict[str, ir.Expr]) -> None:
    """Give each lane its iterations of the group loop: one, bound to the lane, or a
    share of them when the loop is wider than the group.

    Where the group reduces stores whose destination only changes with the loop's
    own iterations (not with a serial loop inside it, such as a column loop), each
    lane keeps a private partial sum and the group reduces once, after the loop
    (``_private``): for a wider loop, and for a loop whose stores sit in a serial
    loop (the nonzeros of a row). Otherwise the lanes take the iterations ``G`` at
    a time, in lockstep, and each step reduces as a group of one iteration per
    lane would (a reduction of running sums then already happens after the loop).
    """
    loop = group.loop
    wide = group.width > group.group
    steady, moving, looped = _group_calls(loop.body, frozenset())
    group.shared = wide or bool(steady and not moving and looped)
    if steady and not moving and group.shared:
        _private(group, steady, defs)
    elif wide:
        steps = -(-group.width // group.group)
        body = _extended(group, by_id, steps * group.group, defs)
        loop.body = _strided(group, body)
    else:  # lane l runs iteration l; the padding lanes of a warp run none
        loop.body = _extended(group, by_id, max(group.group, group.modulus), defs)


def _strided(group: GpuLoop, body: list[ir.Stmt]) -> list[ir.Stmt]:
    """Lane ``l`` runs iterations ``l``, ``l + G``, ...: at each step the lanes read
    consecutive iterations (coalesced loads). ``body`` is one guarded iteration."""
    loop = group.loop
    lanes = Const(group.group, I64)
    steps: ir.Expr = Const(-(-group.width // group.group), I64)
    if group.modulus > group.group:  # a warp's padding: whole tiles of idle lanes
        steps = ir.Select(ir.Cmp("<", lane(loop), lanes), steps, Const(0, I64))
    step = Var(f"{loop.var.name}_step", I64)
    first = ir.Decl(loop.var, ir.add(loop.start, ir.add(ir.mul(step, lanes), lane(loop))))
    return [ir.For(step, Const(0, I64), steps, [first, *body])]


def _private(group: GpuLoop, calls: list[ir.Call], defs: dict[str, ir.Expr]) -> None:
    """Each lane sums its share of the iterations privately, then the group reduces.

    For ``Segment`` a lane takes consecutive iterations (Sgap's "g nonzeros per
    thread") and keeps one partial sum per run of equal destinations: when the
    destination changes, the finished run is added atomically (a neighbouring lane
    or group may share that row), and the lane's last run goes to
    ``segReduceGroup``, which combines it with the lanes next to it. For
    ``ParallelReduction`` every iteration adds into one destination, so a lane
    keeps one sum; the iterations are strided for coalesced loads, and
    ``atomicAddGroup`` adds the tile's total once.
    """
    loop = group.loop
    name = loop.var.name
    segment = group.par.strategy == "Segment"
    if not segment:
        variant = _variant(loop)
        if any(names(c.args[1]) & variant for c in calls):
            raise several_entries(group)
    before: list[ir.Stmt] = []
    after: list[ir.Stmt] = []
    sums: dict[int, list[ir.Stmt]] = {}
    for n, call in enumerate(calls, 1):
        array, index, value, size = call.args
        cur = Var(f"{name}_cur{n}", I64)
        acc = Var(f"{name}_acc{n}", array.elem)
        zero = Const(0, array.elem)
        before += [ir.Decl(cur, Const(-1, I64)), ir.Decl(acc, zero)]
        after.append(ir.Call(call.name, [array, cur, acc, size]))
        add = ir.Assign(acc, ir.add(acc, value))
        if not segment:
            sums[id(call)] = [ir.Assign(cur, index), add]
            continue
        at = Var(f"{name}_at{n}", I64)
        flush = ir.Store(array, cur, acc, accumulate=True, atomic=True)
        finished = [ir.If(ir.Cmp(">=", cur, Const(0, I64)), [flush]), ir.Assign(acc, zero)]
        sums[id(call)] = [
            ir.Decl(at, index),
            ir.If(ir.Cmp("!=", at, cur), finished),
            ir.Assign(cur, at),
            add,
        ]
    body = _replace(loop.body, sums)
    share = -(-group.width // group.group)
    if segment:
        first = ir.add(loop.start, ir.mul(lane(loop), Const(share, I64)))
        last = ir.minimum(ir.add(first, Const(share, I64)), loop.end)
        lanes = [ir.For(loop.var, first, last, body)]
    else:
        guard = _guard(group, share * group.group, defs)
        lanes = _strided(group, body if guard is None else [ir.If(guard, body)])
    loop.body = [*before, *lanes, *after]


def lane(loop: ir.For) -> Var:
    """The lane of a group whose loop has more iterations than lanes."""
    return Var(f"{loop.var.name}_lane", I64)


def _group_calls(
    stmts: list[ir.Stmt], inner: frozenset[str]
) -> tuple[list[ir.Call], list[ir.Call], bool]:
    """The group collectives in ``stmts``, split by whether one private sum per lane can
    stand for each: its destination must not change within the serial loops around it
    (``inner`` holds the names those loops vary). GPU loops only bind an index. The flag
    says whether a collective of the first kind sits in a serial loop, where a private
    sum saves a reduction per iteration."""
    steady: list[ir.Call] = []
    moving: list[ir.Call] = []
    looped = False
    for s in stmts:
        if isinstance(s, ir.Call) and s.name in GROUP_CALLS:
            moves = bool(names(s.args[1]) & inner)
            (moving if moves else steady).append(s)
            looped = looped or (bool(inner) and not moves)
        varies = inner
        if isinstance(s, ir.While) or (isinstance(s, ir.For) and not is_gpu(s)):
            varies = inner | declared(s.body) | assigned(s.body)
            varies |= {s.var.name} if isinstance(s, ir.For) else set()
        for block in blocks(s):
            a, b, c = _group_calls(block, varies)
            steady += a
            moving += b
            looped = looped or c
    return steady, moving, looped


def _replace(stmts: list[ir.Stmt], new: dict[int, list[ir.Stmt]]) -> list[ir.Stmt]:
    """``stmts`` with each statement whose id is in ``new`` replaced by its statements."""
    out: list[ir.Stmt] = []
    for s in stmts:
        if id(s) in new:
            out += new[id(s)]
            continue
        if isinstance(s, ir.If):
            s = replace(s, then=_replace(s.then, new), orelse=_replace(s.orelse, new))
        elif isinstance(s, ir.For | ir.While):
            s.body = _replace(s.body, new)  # in place: GPU loops are known by identity
        out.append(s)
    return out


def _variant(loop: ir.For) -> set[str]:
    """Names in the loop's body whose value differs between its iterations."""
    variant = {loop.var.name} | assigned(loop.body)
    for s in statements(loop.body):
        if isinstance(s, ir.Decl) and names(s.init) & variant:
            variant.add(s.var.name)
    return variant
