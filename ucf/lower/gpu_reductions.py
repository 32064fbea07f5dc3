"""How every store of a GPU nest combines the work of the threads that run it:
plain, atomic, or reduced over a group's tile (``ucf.lower.gpu_grid``)."""

from __future__ import annotations

from ucf.errors import ScheduleError
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import (
    assigned,
    containers,
    names,
    walk,
)
from ucf.lower.gpu_loops import REDUCING, GpuLoop, several_entries


class Reductions:
    """Decide how every store of a nest combines the work of the threads that run it."""

    def __init__(self, stmts, by_id, group, races):
        self.stmts = stmts
        self.by_id = by_id
        self.group = group
        self.races = races
        self.sums: set[str] = set()
        self.handled: set[int] = set()
        self.group_reduces = False

    def run(self) -> set[str]:
        self._accumulators(self.stmts)
        self._stores(self.stmts)
        g = self.group
        if g is not None and g.par.strategy in REDUCING and not self.group_reduces:
            raise ScheduleError(
                f"{g.cmd}: {g.label} iterates no reduction variable and feeds no running sum, "
                f"so its group has nothing to reduce; use NoRaces"
            )
        return self.sums

    def _gpu(self, path) -> list[GpuLoop]:
        return [self.by_id[id(s)] for s in path if id(s) in self.by_id]

    def _accumulators(self, stmts: list[ir.Stmt]) -> None:
        for container in containers(stmts):
            for a, decl in enumerate(container):
                if isinstance(decl, ir.Decl):
                    self._accumulator(container, a, decl)

    def _accumulator(self, container: list[ir.Stmt], a: int, decl: ir.Decl) -> None:
        t = decl.var.name
        after = container[a + 1 :]
        adds = [
            (s, self._gpu(path))
            for s, path in walk(after)
            if isinstance(s, ir.Assign) and s.var.name == t
        ]
        if not any(loops for _, loops in adds):
            return
        stores = [
            k
            for k, s in enumerate(after)
            if isinstance(s, ir.Store) and isinstance(s.value, Var) and s.value.name == t
        ]
        summing = all(
            isinstance(s.value, ir.Bin)
            and s.value.op == "+"
            and s.value.left == s.var
            and t not in names(s.value.right)
            for s, _ in adds
        )
        zero = isinstance(decl.init, Const) and decl.init.value == 0
        if not (summing and zero and len(stores) == 1):
            return  # _check_carried reports the loop that carries it
        store = after[stores[0]]
        enclosing = {id(g.loop) for g in self._gpu(path_to(self.stmts, store))}
        nest = set(self.by_id)
        missing = nest - enclosing
        loops = {id(g.loop): g for _, gs in adds for g in gs if id(g.loop) not in enclosing}
        for _, gs in adds:
            lacking = missing - {id(g.loop) for g in gs}
            if lacking:
                g = self.by_id[next(iter(sorted(lacking)))]
                raise ScheduleError(
                    f"{g.cmd}: {t} is added to outside the loop over {g.label}, so every "
                    f"thread of {g.label} would add it again; move the sum inside {g.label}"
                )
        for g in loops.values():
            if g.par.strategy in ("NoRaces", "IgnoreRaces"):
                raise ScheduleError(
                    f"{g.cmd}: iterations of {g.label} add into the running sum {t}; use "
                    "Atomics, or a GPUGroup with ParallelReduction or Segment"
                )
        combine = self._combine(store, store.index, Var(t, decl.var.type), loops.values())
        container[a + 1 + stores[0]] = combine
        self.handled.add(id(combine))
        self.sums.add(t)

    def _combine(self, store: ir.Store, index, value, loops) -> ir.Stmt:
        g = self.group
        if g is not None and any(x is g for x in loops) and g.par.strategy in REDUCING:
            name = "segReduceGroup" if g.par.strategy == "Segment" else "atomicAddGroup"
            if name == "atomicAddGroup" and names(index) & assigned(g.loop.body):
                raise several_entries(g)
            self.group_reduces = True
            return ir.Call(name, [store.array, index, value, Const(g.group, I64)])
        return ir.Store(store.array, index, value, accumulate=True, atomic=True)

    def _stores(self, stmts: list[ir.Stmt]) -> None:
        for container in containers(stmts):
            for k, s in enumerate(container):
                if isinstance(s, ir.Store) and id(s) not in self.handled:
                    container[k] = self._store(s, path_to(self.stmts, s))

    def _store(self, s: ir.Store, path) -> ir.Stmt:
        enclosing = self._gpu(path)
        missing = set(self.by_id) - {id(g.loop) for g in enclosing}
        if missing:
            g = self.by_id[next(iter(sorted(missing)))]
            raise ScheduleError(
                f"{g.cmd}: the store into {s.array.name} is outside the loop over {g.label}, "
                f"so every thread of {g.label} would run it; reorder so that it is inside, or "
                "reduce into a running sum"
            )
        racing = [g for g in enclosing if self.races.get(g.label)]
        for g in racing:
            if g.par.strategy == "NoRaces":
                v = self.races[g.label][0]
                raise ScheduleError(
                    f"{g.cmd}: {v} is a reduction variable, so iterations add into the same "
                    "output entries; NoRaces promises they never do (use Atomics, IgnoreRaces, "
                    "or a GPUGroup with ParallelReduction or Segment)"
                )
        group = self.group
        if group is not None and group in racing and group.par.strategy in REDUCING:
            if not s.accumulate:
                raise ScheduleError(
                    f"{group.cmd}: the store into {s.array.name} overwrites rather than adds, "
                    "so the group has no sum to reduce"
                )
            return self._combine(s, s.index, s.value, [group])
        # As in TACO, Atomics makes the reductions in its loop's body atomic, whichever
        # enclosing loop they race on (a column loop inside IgnoreRaces blocks of nonzeros).
        if racing and any(g.par.strategy == "Atomics" for g in enclosing):
            return ir.Store(s.array, s.index, s.value, accumulate=True, atomic=True)
        return s


def path_to(stmts: list[ir.Stmt], target: ir.Stmt) -> tuple:
    for s, path in walk(stmts):
        if s is target:
            return path
    raise AssertionError("statement not in nest")  # pragma: no cover
