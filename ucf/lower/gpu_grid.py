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
  of them itself, into a private partial sum where it can (``ucf.lower.gpu_lanes``).
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
from ucf.ir.gpu_nodes import Launch, Module, Scope, Special
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import (
    assigned,
    declared,
    names,
    nodes,
    reads,
    walk,
)
from ucf.lower.gpu_bounds import fold_constant, inline_definitions, single_definitions
from ucf.lower.gpu_lanes import lane, share_iterations
from ucf.lower.gpu_loops import (
    MAX_THREADS,
    WARP,
    GpuLoop,
    has_gpu,
    is_gpu,
)
from ucf.lower.gpu_reductions import Reductions
from ucf.lower.transforms import catches_up
from ucf.schedule import Parallel


# --------------------------------------------------------------------- entry
def lower(fn: ir.Function, parallel: dict[str, Parallel], races: dict[str, list[str]]) -> Module:
    """Outline every GPU nest of ``fn`` into a kernel; ``races[label]`` lists the reduction
    variables a parallel loop iterates (iterations may add into the same entries)."""
    fn = copy.deepcopy(fn)
    defs = single_definitions(fn)
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
            share_iterations(group, by_id, self.defs)
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
            extent = inline_definitions(ir.sub(g.loop.end, g.loop.start), local)
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
        start = fold_constant(g.loop.start, self.defs)
        end = fold_constant(g.loop.end, self.defs, upper=True)
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
                    bind = ir.Decl(lane(s), index)
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


def _pow2(n: int) -> bool:
    return 1 <= n <= WARP and n & (n - 1) == 0
