"""Mapping GPU-parallel loops onto a CUDA grid: an LLIR -> LLIR pass.

``parallelize`` only marks loops with a GPU unit (``parallel._mark_gpu``).
This pass then outlines each nest of marked loops into a device kernel and
leaves a host launcher behind, so the CUDA printer (``ucf/codegen/cuda.py``)
prints LLIR and nothing else.

The mapping, in one sentence: a GPU loop is not run, it is *bound*; every GPU
thread executes the nest's code with each GPU loop restricted to one
iteration, its own. In detail:

- ``GPUBlock`` loops bind ``blockIdx.x``, ``.y``, ``.z`` (outermost first).
  The grid is fixed at launch, so their bounds must be computable before the
  kernel starts.
- ``GPUWarp``, ``GPUThread`` and ``GPUGroup`` loops (thread-level) share
  ``threadIdx.x`` as a mixed-radix number. Each needs a trip count known when
  the kernel is compiled (a split's inner loop, a divide's outer loop, a
  bound loop); that count is its radix. The group's lanes are the fastest
  digit, so a ``thread_block_tile<G>`` is exactly one group. A warp's digit
  steps by 32 lanes, padding the loops inside it. A group loop with more
  iterations than lanes is the exception to binding: each lane runs a share
  of them itself, into a private partial sum where it can (``_share``).
- Code between GPU loops runs in every thread that reaches it. Scalars are
  therefore private, and a running sum carried across GPU loops is a partial
  sum per thread, combined where the sum is stored: ``Atomics`` adds each
  partial atomically, ``ParallelReduction`` (and ``Temporary``) reduce over
  the group's tile first (``atomicAddGroup``), ``Segment`` reduces runs of
  equal destinations (``segReduceGroup``). The state a fused ``pos`` loop
  resumes (its current row) is private too: each thread starts from its
  block's search and catches up to its own position.
- Out-of-range iterations (a clipped split's tail, a warp's padding) are
  guarded; inside a group they take part with zero contributions (zero
  extension) instead, so that every lane of the tile reaches each collective.

Every rule the mapping depends on is checked here, with a ``ScheduleError``
that names the loop.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from ucf.errors import ScheduleError
from ucf.ir import nodes as ir
from ucf.ir.gpu_nodes import GROUP_CALLS, Launch, Module, Scope, Special
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import (
    assigned,
    blocks,
    declared,
    names,
    nodes,
    reads,
    statements,
    walk,
)
from ucf.lower.gpu_loops import (
    MAX_THREADS,
    WARP,
    GpuLoop,
    has_gpu,
    is_gpu,
    several_entries,
)
from ucf.lower.gpu_predication import Predicator, collective
from ucf.lower.gpu_reductions import Reductions
from ucf.lower.transforms import catches_up
from ucf.schedule import Parallel


# --------------------------------------------------------------------- constants
def _defs(fn: ir.Function) -> dict[str, ir.Expr]:
    """Declarations of variables declared exactly once: enough to fold loop bounds."""
    seen: dict[str, list[ir.Expr]] = {}
    for s in statements(fn.body):
        if isinstance(s, ir.Decl):
            seen.setdefault(s.var.name, []).append(s.init)
        elif isinstance(s, ir.For):
            seen.setdefault(s.var.name, []).extend([None, None])
    return {k: v[0] for k, v in seen.items() if len(v) == 1}


def _fold(e: ir.Expr, defs: dict[str, ir.Expr], upper: bool = False) -> int | None:
    """The value of an integer expression when it is constant; with ``upper``, a
    constant upper bound through ``min`` (a clipped split's inner bound)."""
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Var):
        d = defs.get(e.name)
        return None if d is None else _fold(d, defs, upper)
    if isinstance(e, ir.Cast):
        return _fold(e.operand, defs, upper)
    if isinstance(e, ir.Bin):
        a, b = _fold(e.left, defs, upper), _fold(e.right, defs, upper)
        if e.op == "min" and upper:
            known = [x for x in (a, b) if x is not None]
            return min(known) if known else None
        if a is None or b is None:
            return None
        if e.op in ("+", "-", "*", "min", "max"):
            return {"+": a + b, "-": a - b, "*": a * b, "min": min(a, b), "max": max(a, b)}[e.op]
        if e.op in ("/", "%") and b > 0 and a >= 0:
            return a // b if e.op == "/" else a % b
    return None


def _inline(e: ir.Expr, defs: dict[str, ir.Expr]) -> ir.Expr:
    """``e`` with the named variables replaced by their definitions, transitively."""
    from ucf.ir.walk import substitute

    for _ in range(64):
        names: set[str] = set()
        reads(e, names)
        todo = {n: defs[n] for n in names if n in defs}
        if not todo:
            return e
        e = substitute(e, todo)
    raise ScheduleError("a GPU loop bound is defined circularly")  # pragma: no cover


# --------------------------------------------------------------------- entry
def lower(fn: ir.Function, parallel: dict[str, Parallel], races: dict[str, list[str]]) -> Module:
    """Outline every GPU nest of ``fn`` into a kernel; ``races[label]`` lists the reduction
    variables a parallel loop iterates (iterations may add into the same entries)."""
    fn = copy.deepcopy(fn)
    defs = _defs(fn)
    state = _Outliner(fn, parallel, races, defs)
    if not has_gpu(fn.body):
        body = state.single_thread()
    else:
        body = state.host(fn.body)
    host = ir.Function(f"{fn.name}_launch", fn.params, body, doc=fn.doc)
    return Module(state.kernels, host, state.notes)


class _Outliner:
    def __init__(self, fn, parallel, races, defs):
        self.fn = fn
        self.parallel = parallel
        self.races = races
        self.defs = defs
        self.kernels: list[ir.Function] = []
        self.notes: list[str] = []

    # ------------------------------------------------------------ host side
    def single_thread(self) -> list[ir.Stmt]:
        """No GPU loops: the whole function runs in one GPU thread."""
        self.notes.append("no GPU loops: the kernel runs in a single GPU thread")
        return [self._kernel(list(self.fn.body), [Const(1, I64)], 1)]

    def host(self, stmts: list[ir.Stmt]) -> list[ir.Stmt]:
        """Host statements with every GPU nest replaced by its launch."""
        out: list[ir.Stmt] = []
        rest = list(stmts)
        while rest:
            s = rest.pop(0)
            if is_gpu(s):
                if s.parallel != "GPUBlock":
                    par = self.parallel.get(s.label) or Parallel(s.parallel, s.strategy)
                    raise ScheduleError(
                        f"parallelize({s.label}, {par}): {s.label} is not inside a GPUBlock "
                        f"loop; GPU threads belong to a block, so parallelize a loop around "
                        f"{s.label} with GPUBlock"
                    )
                before, after = self._pull_sums(s, out, rest)
                out.append(self._nest([*before, s, *after]))
            elif has_gpu([s]):
                new = copy.copy(s)
                if isinstance(s, ir.For | ir.While):
                    new.body = self.host(s.body)
                elif isinstance(s, ir.If):
                    new.then, new.orelse = self.host(s.then), self.host(s.orelse)
                out.append(new)
            else:
                out.append(s)
        return out

    def _pull_sums(self, root: ir.For, before: list[ir.Stmt], after: list[ir.Stmt]):
        """Running sums declared before the nest and stored after it move into the kernel."""
        carried = sorted(assigned(root.body) - declared(root.body))
        pulled_decls, pulled_stores = [], []
        for name in carried:
            decl = next((s for s in before if isinstance(s, ir.Decl) and s.var.name == name), None)
            stores = [
                s
                for s in after
                if isinstance(s, ir.Store) and isinstance(s.value, Var) and s.value.name == name
            ]
            used = set()
            reads([s for s in after if s not in stores], used)
            if decl is None or len(stores) != 1 or name in used:
                continue  # _check_carried reports it
            before.remove(decl)
            after.remove(stores[0])
            pulled_decls.append(decl)
            pulled_stores.append(stores[0])
        return pulled_decls, pulled_stores

    # ------------------------------------------------------------ one nest
    def _nest(self, stmts: list[ir.Stmt]) -> ir.Stmt:
        loops = [GpuLoop(s, self._par(s), path) for s, path in walk(stmts) if is_gpu(s)]
        blocks_ = [g for g in loops if g.unit == "GPUBlock"]
        threads = [g for g in loops if g.unit != "GPUBlock"]
        grid = self._grid(blocks_, stmts)
        group = self._chain(threads)
        nthreads = self._radices(threads, group)
        by_id = {id(g.loop): g for g in loops}
        sums = Reductions(stmts, by_id, group, self.races).run()
        self._check_carried(loops, sums)
        if group is not None:
            self._share(group, by_id)
        body = self._bind(stmts, by_id)
        return self._kernel(body, grid, nthreads)

    def _par(self, loop: ir.For) -> Parallel:
        par = self.parallel.get(loop.label)
        return par if par is not None else Parallel(loop.parallel, loop.strategy)

    def _grid(self, blocks_: list[GpuLoop], stmts: list[ir.Stmt]) -> list[ir.Expr]:
        """Grid dimensions, outermost GPUBlock loop first; computable before the launch."""
        if len(blocks_) > 3:
            raise ScheduleError(
                f"{blocks_[3].cmd}: a CUDA grid has three dimensions, and this kernel has "
                f"{len(blocks_)} GPUBlock loops"
            )
        made: dict[str, list[ir.Expr]] = {}
        for s, _ in walk(stmts):
            if isinstance(s, ir.Decl):
                made.setdefault(s.var.name, []).append(s.init)
            elif isinstance(s, ir.For):
                made.setdefault(s.var.name, []).extend([s.start, s.end])
        changed = assigned(stmts)
        local = {k: v[0] for k, v in made.items() if len(v) == 1 and k not in changed}
        grid = []
        for dim, g in zip("xyz", blocks_, strict=False):
            g.dim = dim
            extent = _inline(ir.sub(g.loop.end, g.loop.start), local)
            bad = sorted(names(extent) & (set(made) | changed))
            if bad:
                raise ScheduleError(
                    f"{g.cmd}: the number of {g.label} blocks depends on {bad[0]}, which the "
                    "GPU loops compute; a grid is fixed when the kernel is launched"
                )
            grid.append(extent)
        return grid

    def _chain(self, threads: list[GpuLoop]) -> GpuLoop | None:
        """Thread-level loops must nest in one chain; returns the group, if any."""
        threads.sort(key=lambda g: len(g.path))
        for outer, inner in zip(threads, threads[1:], strict=False):
            if outer.loop not in inner.path:
                raise ScheduleError(
                    f"{inner.cmd}: the thread-level GPU loops {outer.label} and {inner.label} "
                    "are not nested; the threads of a block come from one chain of nested "
                    "GPU loops"
                )
        groups = [g for g in threads if g.unit == "GPUGroup"]
        if len(groups) > 1:
            raise ScheduleError(f"{groups[1].cmd}: a kernel has one GPUGroup loop")
        group = groups[0] if groups else None
        for g in threads:
            self._slot(g)
            if g.par.strategy in ("ParallelReduction", "Temporary") and g.unit != "GPUGroup":
                innermost = g is threads[-1] and group is None
                if not (innermost and g.unit == "GPUThread" and _pow2(g.radix)):
                    raise ScheduleError(
                        f"{g.cmd}: only a group of lanes reduces in parallel: use GPUGroup "
                        "(or make this the innermost GPUThread loop, with a power of two of "
                        "at most 32 threads), or Atomics"
                    )
                group = g
        if group is not None:
            group.group = group.par.size or group.radix
            group.width = group.radix
            group.radix = group.group
        return group

    def _slot(self, g: GpuLoop) -> None:
        start = _fold(g.loop.start, self.defs)
        end = _fold(g.loop.end, self.defs, upper=True)
        if start is None or end is None:
            raise ScheduleError(
                f"{g.cmd}: the loop over {g.label} has no trip count known when the kernel is "
                "compiled, and a GPU block has a fixed number of threads; split the loop and "
                "parallelize its inner loop (at most the factor's iterations), or bound it"
            )
        g.radix = max(end - start, 1)

    def _radices(self, threads: list[GpuLoop], group: GpuLoop | None) -> int:
        order = [g for g in threads if g is not group] + ([group] if group else [])
        size = 1
        for g in reversed(order):
            if g.unit == "GPUWarp":
                if size > WARP:
                    raise ScheduleError(
                        f"{g.cmd}: a warp has {WARP} lanes, but the GPU loops inside "
                        f"{g.label} need {size} threads"
                    )
                size = WARP
            g.stride = size
            size *= g.radix
        outer = 0
        for g in order:
            g.modulus = outer
            outer = g.stride
        if size > MAX_THREADS:
            raise ScheduleError(
                f"{order[0].cmd}: the GPU loops of one block need {size} threads; CUDA allows "
                f"at most {MAX_THREADS}"
            )
        return size

    def _check_carried(self, loops: list[GpuLoop], sums: set[str]) -> None:
        for g in loops:
            carried = sorted(assigned(g.loop.body) - declared(g.loop.body) - sums)
            bad = [v for v in carried if not catches_up(g.loop.body, v)]
            if bad:
                raise ScheduleError(
                    f"{g.cmd}: the loop carries {', '.join(bad)} from one iteration to the "
                    "next (a sparse iterator co-iterated with a dense dimension), so it cannot "
                    "be parallelized"
                )

    def _extended(self, group: GpuLoop, by_id: dict[int, GpuLoop], span: int) -> list[ir.Stmt]:
        """The group loop's body for the iteration a lane is bound to, when the lanes take
        ``span`` iterations together: out-of-range iterations are guarded, and inside the
        group they are predicated instead, so that every lane reaches each collective."""
        loop = group.loop
        guard = self._guard(group, span)
        if not any(collective(s) for s in loop.body):
            return loop.body if guard is None else [ir.If(guard, loop.body)]
        variant = {loop.var.name} | assigned(loop.body)
        return Predicator(variant, by_id, group).block(loop.body, guard)

    def _guard(self, group: GpuLoop, span: int) -> ir.Expr | None:
        """The test that an iteration is in range, unless the loop has ``span`` of them."""
        loop = group.loop
        full = _fold(ir.sub(loop.end, loop.start), self.defs)
        return None if full is not None and full >= span else ir.Cmp("<", loop.var, loop.end)

    def _share(self, group: GpuLoop, by_id: dict[int, GpuLoop]) -> None:
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
            self._private(group, steady)
        elif wide:
            steps = -(-group.width // group.group)
            body = self._extended(group, by_id, steps * group.group)
            loop.body = self._strided(group, body)
        else:  # lane l runs iteration l; the padding lanes of a warp run none
            loop.body = self._extended(group, by_id, max(group.group, group.modulus))

    def _strided(self, group: GpuLoop, body: list[ir.Stmt]) -> list[ir.Stmt]:
        """Lane ``l`` runs iterations ``l``, ``l + G``, ...: at each step the lanes read
        consecutive iterations (coalesced loads). ``body`` is one guarded iteration."""
        loop = group.loop
        lanes = Const(group.group, I64)
        steps: ir.Expr = Const(-(-group.width // group.group), I64)
        if group.modulus > group.group:  # a warp's padding: whole tiles of idle lanes
            steps = ir.Select(ir.Cmp("<", _lane(loop), lanes), steps, Const(0, I64))
        step = Var(f"{loop.var.name}_step", I64)
        first = ir.Decl(loop.var, ir.add(loop.start, ir.add(ir.mul(step, lanes), _lane(loop))))
        return [ir.For(step, Const(0, I64), steps, [first, *body])]

    def _private(self, group: GpuLoop, calls: list[ir.Call]) -> None:
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
            first = ir.add(loop.start, ir.mul(_lane(loop), Const(share, I64)))
            last = ir.minimum(ir.add(first, Const(share, I64)), loop.end)
            lanes = [ir.For(loop.var, first, last, body)]
        else:
            guard = self._guard(group, share * group.group)
            lanes = self._strided(group, body if guard is None else [ir.If(guard, body)])
        loop.body = [*before, *lanes, *after]

    # ------------------------------------------------------------ kernel
    def _bind(self, stmts: list[ir.Stmt], by_id: dict[int, GpuLoop]) -> list[ir.Stmt]:
        out: list[ir.Stmt] = []
        for s in stmts:
            g = by_id.get(id(s))
            if g is not None:
                body = self._bind(s.body, by_id)
                if g.unit == "GPUBlock":
                    index: ir.Expr = Special(f"blockIdx.{g.dim}")
                else:
                    tid: ir.Expr = Special("threadIdx.x")
                    if g.modulus:
                        tid = ir.Bin("%", tid, Const(g.modulus, I64))
                    index = ir.Bin("/", tid, Const(g.stride, I64)) if g.stride > 1 else tid
                bind = ir.Decl(s.var, ir.add(s.start, index))
                if g.shared:
                    bind = ir.Decl(_lane(s), index)
                if g.unit == "GPUBlock" or g.group:
                    out.append(Scope([bind, *body]))
                else:
                    out.append(Scope([bind, ir.If(ir.Cmp("<", s.var, s.end), body)]))
                continue
            new = copy.copy(s)
            if isinstance(s, ir.For | ir.While):
                new.body = self._bind(s.body, by_id)
            elif isinstance(s, ir.If):
                new.then, new.orelse = self._bind(s.then, by_id), self._bind(s.orelse, by_id)
            out.append(new)
        return out

    def _kernel(self, body: list[ir.Stmt], grid: list[ir.Expr], threads: int) -> Launch:
        kname = f"{self.fn.name}_k{len(self.kernels)}"
        used: dict[str, Var] = {}
        for n in nodes(body):
            if isinstance(n, Var):
                used.setdefault(n.name, n)
        free: set[str] = set()
        reads(body, free)
        free -= {s.var.name for s, _ in walk(body) if isinstance(s, ir.Decl | ir.For)}
        arrays = {n.name: n for n in nodes(body) if isinstance(n, ir.Array)}
        written = {s.array.name for s, _ in walk(body) if isinstance(s, ir.Store)}
        written |= {s.args[0].name for s, _ in walk(body) if isinstance(s, ir.Call) and s.args}
        params, args = [], []
        for p in self.fn.params:
            if p.is_array and p.name in arrays:
                params.append(replace(p, output=p.name in written))
                args.append(arrays[p.name])
            elif not p.is_array and p.name in free:
                params.append(p)
                args.append(used[p.name])
        known = {p.name for p in self.fn.params}
        for name in sorted(free - known):
            v = used[name]
            params.append(ir.Param(name, v.type, False, doc="captured from the host code"))
            args.append(v)
        self.kernels.append(ir.Function(kname, params, body, doc=f"GPU kernel {kname}."))
        return Launch(kname, grid, threads, args)


def _lane(loop: ir.For) -> Var:
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


def _pow2(n: int) -> bool:
    return 1 <= n <= WARP and n & (n - 1) == 0
