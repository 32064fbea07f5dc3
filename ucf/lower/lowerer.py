"""Lower a CIN to LLIR functions.

The loop nest follows ``cin.order``.  At each index variable the operands
whose next level is sparse form a merge lattice: a product intersects, a sum
unions.  One loop is emitted per lattice point (a ``for`` over a dense
dimension when the top point is full, a ``for`` over positions when one
iterator drives, a ``while`` co-iteration otherwise), and inside it one case
per set of matching iterators with the expression restricted to that set.
Dense levels are located, never searched.

A sparse output is built in two passes over the same loops: ``assemble``
counts the entries each output level receives, the executor allocates, and
``compute`` writes coordinates, positions and values.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ucf.cin.notation import CIN
from ucf.errors import ScheduleError, UnsupportedError
from ucf.format.format import Format
from ucf.ir import nodes as ir
from ucf.ir.nodes import Array, Const, Param, Var
from ucf.ir.simplify import assigned, declared
from ucf.lang.ast import accesses
from ucf.lower.lattice import (
    Lit,
    Negate,
    Op,
    Opnd,
    Term,
    from_ast,
    lattice,
    operands,
    restrict,
)

I64 = "i64"


@dataclass
class SlotParams:
    """The parameters through which one operand storage reaches the kernel."""

    dims: list[Var]
    levels: list[dict[str, Array]]
    vals: Array


@dataclass
class Operand:
    n: int
    name: str  # readable prefix for this occurrence's iterator variables
    fmt: Format
    level_vars: list[str]
    params: SlotParams

    @property
    def dense(self) -> bool:
        return self.fmt.is_dense


@dataclass
class State:
    """Where each operand's and the output's walk down its levels has got to."""

    depth: int = 0
    levels: dict = field(default_factory=dict)  # operand -> levels resolved
    pos: dict = field(default_factory=dict)  # operand -> position expr of last resolved level
    seg_end: dict = field(default_factory=dict)  # operand -> end of a non-unique run
    out_level: int = 0
    out_pos: ir.Expr = Const(0, I64)
    acc: Var | None = None
    pending: tuple | None = (
        None  # (level, coordinate) of an output append deferred past a reduction
    )
    hit: Var | None = None  # set when the deferred reduction met a nonzero term

    def copy(self) -> State:
        return State(
            self.depth,
            dict(self.levels),
            dict(self.pos),
            dict(self.seg_end),
            self.out_level,
            self.out_pos,
            self.acc,
            self.pending,
            self.hit,
        )


@dataclass
class Lowered:
    """The kernel functions plus what the executor needs to call them."""

    compute: ir.Function
    assemble: ir.Function | None  # set for sparse outputs: counts entries per level


class Lowerer:
    def __init__(self, cin: CIN, value_type: str, index_type: str, name: str = "kernel"):
        self.cin = cin
        self.vt = value_type
        self.it = index_type
        self.name = name
        stmt = cin.statement
        self.term = from_ast(stmt.rhs)
        self.rhs_accesses = accesses(stmt.rhs)
        self._check_supported()
        self.extents = {v: Var(f"n_{v}", I64) for v in cin.order}
        self.slot_params: dict[str, SlotParams] = {}
        self.operands: dict[int, Operand] = {}
        counts: dict[str, int] = {}
        for a in self.rhs_accesses:
            counts[a.tensor] = counts.get(a.tensor, 0) + 1
        seen: dict[str, int] = {}
        for n, a in enumerate(self.rhs_accesses):
            slot = cin.slots[n]
            if slot.name not in self.slot_params:
                self.slot_params[slot.name] = self._slot_params(
                    slot.name, slot.format, len(a.indices)
                )
            seen[a.tensor] = seen.get(a.tensor, 0) + 1
            label = a.tensor if counts[a.tensor] == 1 else f"{a.tensor}{seen[a.tensor]}"
            lv = [a.indices[m].single_variable for m in slot.format.mode_order]
            self.operands[n] = Operand(n, label, slot.format, lv, self.slot_params[slot.name])
        self.out_fmt = cin.output_format
        out = stmt.lhs
        self.out_name = out.tensor
        self.out_vars = [i.single_variable for i in out.indices]
        self.out_level_vars = [out.indices[m].single_variable for m in self.out_fmt.mode_order]
        self.sparse_out = not self.out_fmt.is_dense
        self.out_params = self._slot_params(out.tensor, self.out_fmt, len(out.indices), output=True)
        self.counters = [Var(f"{out.tensor}{lvl}_size", I64) for lvl in range(self.out_fmt.order)]
        self.assembling = False
        self._fresh = itertools.count()

    # ---------------------------------------------------------------- checks
    def _check_supported(self) -> None:
        stmt = self.cin.statement
        if len(set(self.cin.output_vars)) != len(self.cin.output_vars):
            raise UnsupportedError(f"output {stmt.lhs}: a repeated index variable is not supported")
        _check_divisors(self.term, self.cin)
        if self.vt in ir.INT_TYPES and _has_division(self.term):
            raise UnsupportedError("division is not supported in integer kernels")

    # ------------------------------------------------------------ parameters
    def _slot_params(self, name: str, fmt: Format, order: int, output: bool = False) -> SlotParams:
        dims = [Var(f"{name}_dim{m}", I64) for m in range(order)]
        levels = []
        for lvl, kind in enumerate(fmt.levels):
            levels.append({a: Array(f"{name}{lvl}_{a}", self.it, output) for a in kind.arrays})
        return SlotParams(dims, levels, Array(f"{name}_vals", self.vt, output))

    def _params(self, assemble: bool) -> list[Param]:
        params = [
            Param(v.name, I64, False, role=("extent", k), doc=f"extent of index variable {k}")
            for k, v in self.extents.items()
        ]
        for slot_name, sp in self.slot_params.items():
            params += self._storage_params(slot_name, sp, output=False)
        if assemble:
            params.append(
                Param(
                    f"{self.out_name}_counts",
                    I64,
                    True,
                    True,
                    role=("counts",),
                    doc="out: number of entries each output level receives",
                )
            )
        else:
            params += self._storage_params(self.out_name, self.out_params, output=True)
        return params

    def _storage_params(self, slot: str, sp: SlotParams, output: bool) -> list[Param]:
        who = "output" if output else "operand"
        params = [
            Param(d.name, I64, False, role=("dim", slot, m), doc=f"{who} {slot}: size of mode {m}")
            for m, d in enumerate(sp.dims)
        ]
        for lvl, arrays in enumerate(sp.levels):
            for key, arr in arrays.items():
                params.append(
                    Param(
                        arr.name,
                        arr.elem,
                        True,
                        output,
                        role=(key, slot, lvl),
                        doc=f"{who} {slot}: level {lvl} {key} array",
                    )
                )
        params.append(
            Param(
                sp.vals.name,
                sp.vals.elem,
                True,
                output,
                role=("vals", slot),
                doc=f"{who} {slot}: values",
            )
        )
        return params

    # ------------------------------------------------------------------ entry
    def lower(self) -> Lowered:
        assemble = None
        if self.sparse_out:
            self.assembling = True
            body = self._function_body()
            body += [
                ir.Store(self._counts_array(), Const(lvl, I64), c)
                for lvl, c in enumerate(self.counters)
            ]
            assemble = ir.Function(
                f"{self.name}_assemble",
                self._params(True),
                body,
                doc="Count the entries of each output level.",
            )
            self.assembling = False
        body = self._function_body()
        compute = ir.Function(
            self.name, self._params(False), body, doc=f"Compute {self.cin.statement}."
        )
        return Lowered(compute, assemble)

    def _counts_array(self) -> Array:
        return Array(f"{self.out_name}_counts", I64, True)

    def _function_body(self) -> list[ir.Stmt]:
        body: list[ir.Stmt] = (
            [ir.Decl(c, Const(0, I64)) for c in self.counters] if self.sparse_out else []
        )
        state = State()
        for n in self.operands:
            state.levels[n] = 0
            state.pos[n] = Const(0, I64)
        body += self._at_depth(self.term, state)
        return body

    # --------------------------------------------------------------- descent
    def _at_depth(self, term: Term, st: State) -> list[ir.Stmt]:
        order = self.cin.order
        d = st.depth
        remaining = order[d:]
        out_bound = all(v in order[:d] for v in self.out_vars)
        if self.assembling and out_bound and st.pending is None:
            return []
        if d == len(order):
            return self._leaf(term, st)
        if out_bound and st.acc is None and remaining:
            acc = Var(f"t{next(self._fresh)}", self.vt)
            inner = st.copy()
            inner.acc = acc
            if st.pending is None:
                return [
                    ir.Decl(acc, Const(0, self.vt)),
                    *self._loop(term, inner),
                    self._store_output(st, acc),
                ]
            # A compressed output level gets the coordinate only if some term of
            # the reduction was present, so its pattern is exactly the implied one.
            hit = Var(f"{acc.name}_hit", "i1")
            inner.hit = hit
            lvl, coord = st.pending
            q = Var(f"p{self.out_name}{lvl}", I64)
            insert: list[ir.Stmt] = [ir.Decl(q, self.counters[lvl])]
            if not self.assembling:
                crd = self.out_params.levels[lvl]["crd"]
                insert += [
                    ir.Store(crd, q, ir.cast(coord, self.it)),
                    ir.Store(self.out_params.vals, q, acc),
                ]
            insert.append(ir.Assign(self.counters[lvl], ir.add(self.counters[lvl], Const(1, I64))))
            return [
                ir.Decl(acc, Const(0, self.vt)),
                ir.Decl(hit, Const(False, "i1")),
                *self._loop(term, inner),
                ir.If(hit, insert),
            ]
        return self._loop(term, st)

    def _leaf(self, term: Term, st: State) -> list[ir.Stmt]:
        if st.hit is not None and self.assembling:
            return [ir.Assign(st.hit, Const(True, "i1"))]
        value = self._value(term, st)
        if st.acc is not None:
            flag = [ir.Assign(st.hit, Const(True, "i1"))] if st.hit is not None else []
            return [ir.Assign(st.acc, ir.add(st.acc, value)), *flag]
        return [self._store_output(st, value)]

    def _store_output(self, st: State, value: ir.Expr) -> ir.Stmt:
        # Each output position is reached exactly once when only output variables
        # enclose the store (lattice loops partition the coordinates), so `=`
        # statements can overwrite instead of read-modify-write.
        outer = self.cin.order[: st.depth]
        once = self.cin.statement.op == "=" and all(v in self.out_vars for v in outer)
        if self.sparse_out:
            index = st.out_pos
        else:
            index = self._dense_index(self.out_params, self.out_fmt, self.out_level_vars)
        return ir.Store(self.out_params.vals, index, value, accumulate=not once)

    def _dense_index(self, sp: SlotParams, fmt: Format, level_vars: list[str]) -> ir.Expr:
        index: ir.Expr = Const(0, I64)
        for lvl, v in enumerate(level_vars):
            index = ir.add(ir.mul(index, sp.dims[fmt.mode_order[lvl]]), Var(v, I64))
        return index

    def _value(self, t: Term, st: State) -> ir.Expr:
        if isinstance(t, Opnd):
            op = self.operands[t.n]
            if op.dense:
                return ir.Load(op.params.vals, self._dense_index(op.params, op.fmt, op.level_vars))
            return ir.Load(op.params.vals, st.pos[t.n])
        if isinstance(t, Lit):
            return ir.cast(Const(t.value, "f64" if isinstance(t.value, float) else I64), self.vt)
        if isinstance(t, Negate):
            return ir.Neg(self._value(t.operand, st))
        assert isinstance(t, Op)
        return ir.Bin(t.op, self._value(t.left, st), self._value(t.right, st))

    # ------------------------------------------------------------------ loops
    def _sparse_here(self, v: str, st: State):
        """Operands whose next level is indexed by v, split into sparse and located ones."""
        sparse, located = [], []
        for n, op in self.operands.items():
            if op.dense or st.levels[n] >= op.fmt.order:
                continue
            lvl = st.levels[n]
            if op.level_vars[lvl] != v:
                continue
            (located if op.fmt.levels[lvl].can_locate else sparse).append(n)
        return sparse, located

    def _loop(self, term: Term, st: State) -> list[ir.Stmt]:
        v = self.cin.order[st.depth]
        sparse, located = self._sparse_here(v, st)
        used = operands(term)
        present = [n for n in sparse if n in used]
        points = lattice(term, lambda n: n in present)
        top = points[0]
        stmts: list[ir.Stmt] = []
        iters = {n: self._iterator(n, v, st) for n in present}
        out_kind = self._out_kind(v, st)
        coord = Var(v, I64)
        if len(iters) == 1 and not top.full and next(iter(iters.values())).unique:
            # One iterator drives: a counted loop over its positions, which vectorizes.
            it = next(iter(iters.values()))
            body = [ir.Decl(coord, ir.cast(it.kind.coordinate(it.arrays, it.pos), I64))]
            body += self._cases(term, st, iters, located, coord, set(iters), {}, full=False)
            stmts.append(ir.For(it.pos, it.begin, it.end_expr, body))
        elif top.full:
            for it in iters.values():
                stmts += it.init
            body = self._full_body(term, st, iters, located, coord)
            stmts.append(ir.For(coord, Const(0, I64), self.extents[v], body))
        else:
            for it in iters.values():
                stmts += it.init
            for point in points:
                if not point.iters:
                    continue
                stmts += self._point_loop(term, st, iters, located, coord, point)
        self._schedule_loop(v, stmts)
        if out_kind == "C" and not self.assembling:
            lvl = st.out_level
            stmts.append(
                ir.Store(
                    self.out_params.levels[lvl]["pos"],
                    ir.add(st.out_pos, Const(1, I64)),
                    ir.cast(self.counters[lvl], self.it),
                )
            )
        return stmts

    def _schedule_loop(self, v: str, stmts: list[ir.Stmt]) -> None:
        """Strip-mine and parallelize the loop over v as the schedule asks."""
        split = self.cin.splits.get(v)
        names = (split.outer, split.inner) if split else (v,)
        wanted = [n for n in names if n in self.cin.parallel]
        if split is None and not wanted:
            return
        loops = [k for k, s in enumerate(stmts) if isinstance(s, ir.For | ir.While)]
        if len(loops) != 1 or not isinstance(stmts[loops[0]], ir.For):
            what = (
                f"{split.mode}({v}, ...)"
                if split
                else f"parallelize({v}, {', '.join(self.cin.parallel[v])})"
            )
            raise ScheduleError(
                f"{what}: {v} is co-iterated by while loops over several sparse operands; "
                "only a for loop (a dense dimension or one driving sparse operand) can be "
                "split or run in parallel"
            )
        loop = stmts[loops[0]]
        targets = {v: loop}
        if split:
            prelude, outer, inner = _strip_mine(loop, split)
            stmts[loops[0] : loops[0] + 1] = [*prelude, outer]
            targets = {split.outer: outer, split.inner: inner}
        for name in wanted:
            self._parallelize(v, name, targets[name])

    def _parallelize(self, v: str, name: str, loop: ir.For) -> None:
        """Mark a loop parallel once its preconditions are known to hold."""
        unit, strategy = self.cin.parallel[name]
        cmd = f"parallelize({name}, {unit}, {strategy})"
        if v not in self.out_vars:
            raise ScheduleError(
                f"{cmd}: {v} is a reduction variable, so iterations add into the same output "
                f"entries; {strategy} promises they never do"
            )
        if self.sparse_out:
            raise ScheduleError(
                f"{cmd}: the sparse output {self.out_name} is appended in order, so its loops "
                "cannot run in parallel yet"
            )
        carried = sorted(assigned(loop.body) - declared(loop.body))
        if carried:
            raise ScheduleError(
                f"{cmd}: the loop carries {', '.join(carried)} from one iteration to the next "
                "(a sparse iterator co-iterated with a dense dimension), so it cannot run "
                "in parallel"
            )
        loop.parallel = unit

    def _out_kind(self, v: str, st: State) -> str | None:
        if not self.sparse_out or st.out_level >= self.out_fmt.order:
            return None
        if self.out_level_vars[st.out_level] != v:
            return None
        return self.out_fmt.levels[st.out_level].letter

    def _iterator(self, n: int, v: str, st: State) -> _Iterator:
        op = self.operands[n]
        lvl = st.levels[n]
        kind = op.fmt.levels[lvl]
        arrays = op.params.levels[lvl]
        base = f"{op.name}{lvl}"
        begin, end = kind.bounds(
            arrays, st.pos[n], st.seg_end.get(n), op.params.dims[op.fmt.mode_order[lvl]]
        )
        p = Var(f"p{base}", I64)
        e = Var(f"p{base}_end", I64)
        it = _Iterator(n, p, e, Var(f"{v}{op.name}", I64), kind, arrays, unique=op.fmt.unique(lvl))
        it.begin, it.end_expr = ir.cast(begin, I64), ir.cast(end, I64)
        it.init = [ir.Decl(p, it.begin), ir.Decl(e, it.end_expr)]
        if not it.unique:
            it.seg = Var(f"p{base}_seg", I64)
        return it

    def _coordinate_stmts(self, it: _Iterator) -> list[ir.Stmt]:
        stmts: list[ir.Stmt] = [
            ir.Decl(it.coord, ir.cast(it.kind.coordinate(it.arrays, it.pos), I64))
        ]
        if not it.unique:
            nxt = ir.add(it.seg, Const(1, I64))
            same = ir.land(
                ir.Cmp("<", it.seg, it.end),
                ir.Cmp("==", ir.cast(it.kind.coordinate(it.arrays, it.seg), I64), it.coord),
            )
            stmts += [
                ir.Decl(it.seg, ir.add(it.pos, Const(1, I64))),
                ir.While(same, [ir.Assign(it.seg, nxt)]),
            ]
        return stmts

    def _advance(self, it: _Iterator) -> ir.Expr:
        return it.seg if not it.unique else ir.add(it.pos, Const(1, I64))

    def _full_body(self, term, st, iters, located, coord) -> list[ir.Stmt]:
        """A dense loop over the dimension; sparse iterators are checked for a match."""
        body: list[ir.Stmt] = []
        matches = {}
        for n, it in iters.items():
            m = Var(f"{it.coord.name}_hit", "i1")
            ok = ir.land(
                ir.Cmp("<", it.pos, it.end),
                ir.Cmp("==", ir.cast(it.kind.coordinate(it.arrays, it.pos), I64), coord),
            )
            body.append(ir.Decl(m, ok))
            if not it.unique:
                seg_stmts = self._coordinate_stmts(it)
                body.append(seg_stmts.pop(1))  # the run end, declared where cases can see it
                body.append(ir.If(m, seg_stmts))
            matches[n] = m
        body += self._cases(term, st, iters, located, coord, set(iters), matches, full=True)
        for n, it in iters.items():
            body.append(ir.If(matches[n], [ir.Assign(it.pos, self._advance(it))]))
        return body

    def _point_loop(self, term, st, iters, located, coord, point) -> list[ir.Stmt]:
        its = [iters[n] for n in sorted(point.iters)]
        cond: ir.Expr = Const(True, "i1")
        for it in its:
            cond = ir.land(cond, ir.Cmp("<", it.pos, it.end))
        body: list[ir.Stmt] = []
        for it in its:
            body += self._coordinate_stmts(it)
        mn: ir.Expr = its[0].coord
        for it in its[1:]:
            mn = ir.minimum(mn, it.coord)
        body.append(ir.Decl(coord, mn))
        matches = {}
        for it in its:
            m = Var(f"{it.coord.name}_hit", "i1")
            body.append(ir.Decl(m, ir.Cmp("==", it.coord, coord)))
            matches[it.n] = m
        body += self._cases(term, st, iters, located, coord, set(point.iters), matches, full=False)
        for it in its:
            if len(its) == 1:
                body.append(ir.Assign(it.pos, self._advance(it)))
            else:
                body.append(ir.If(matches[it.n], [ir.Assign(it.pos, self._advance(it))]))
        return [ir.While(cond, body)]

    def _cases(self, term, st, iters, located, coord, live: set[int], matches, full: bool):
        """One branch per set of matching iterators, largest set first."""
        all_here = set(iters)
        chain: list[tuple[ir.Expr, list[ir.Stmt]]] = []
        for size in range(len(live), -1, -1):
            if size == 0 and not full:
                break
            for subset in itertools.combinations(sorted(live), size):
                sub = restrict(term, all_here - set(subset))
                if sub is None:
                    continue
                cond: ir.Expr = Const(True, "i1")
                for n in subset:
                    if n in matches:
                        cond = ir.land(cond, matches[n])
                chain.append((cond, self._case_body(sub, st, iters, located, coord, subset)))
        stmts: list[ir.Stmt] = []
        for cond, body in reversed(chain):
            if isinstance(cond, Const) and cond.value is True:
                stmts = body
            else:
                stmts = [ir.If(cond, body, stmts)]
        return stmts

    def _case_body(self, term, st, iters, located, coord, subset) -> list[ir.Stmt]:
        inner = st.copy()
        inner.depth += 1
        stmts: list[ir.Stmt] = []
        for n in subset:
            it = iters[n]
            inner.levels[n] += 1
            inner.pos[n] = it.pos
            inner.seg_end[n] = it.seg if not it.unique else None
        for n in located:
            op = self.operands[n]
            lvl = st.levels[n]
            dim = op.params.dims[op.fmt.mode_order[lvl]]
            p = Var(f"p{op.name}{lvl}", I64)
            stmts.append(ir.Decl(p, op.fmt.levels[lvl].locate(st.pos[n], coord, dim)))
            inner.levels[n] += 1
            inner.pos[n] = p
            inner.seg_end[n] = None
        kind = self._out_kind(coord.name, st)
        if kind is not None:
            lvl = st.out_level
            inner.out_level += 1
            dim = self.out_params.dims[self.out_fmt.mode_order[lvl]]
            q = Var(f"p{self.out_name}{lvl}", I64)
            last = lvl == self.out_fmt.order - 1
            if kind == "U":
                stmts.append(ir.Decl(q, self.out_fmt.levels[lvl].locate(st.out_pos, coord, dim)))
            elif last and inner.depth < len(self.cin.order):
                inner.pending = (lvl, coord)
                return stmts + self._at_depth(term, inner)
            else:
                stmts.append(ir.Decl(q, self.counters[lvl]))
                if not self.assembling:
                    stmts.append(
                        ir.Store(self.out_params.levels[lvl]["crd"], q, ir.cast(coord, self.it))
                    )
                stmts.append(
                    ir.Assign(self.counters[lvl], ir.add(self.counters[lvl], Const(1, I64)))
                )
            inner.out_pos = q
        return stmts + self._at_depth(term, inner)


@dataclass
class _Iterator:
    n: int
    pos: Var
    end: Var
    coord: Var
    kind: object
    arrays: dict
    unique: bool
    seg: Var | None = None
    init: list = field(default_factory=list)
    begin: ir.Expr | None = None
    end_expr: ir.Expr | None = None


def _strip_mine(loop: ir.For, split) -> tuple[list[ir.Stmt], ir.For, ir.For]:
    """``for x in [a, b)`` as an outer loop over blocks and an inner loop within one.

    The inner bound is clipped to the range, so a tail needs no guard and the
    inner loop still vectorizes.
    """
    x = loop.var.name
    lo, hi = Var(f"{x}_lo", I64), Var(f"{x}_hi", I64)
    outer, inner = Var(split.outer, I64), Var(split.inner, I64)
    count = ir.sub(hi, lo)
    prelude: list[ir.Stmt] = [ir.Decl(lo, loop.start), ir.Decl(hi, loop.end)]
    one = Const(1, I64)
    if split.mode == "split":
        chunk: ir.Expr = Const(split.amount, I64)
        blocks = ir.Bin("/", ir.add(count, Const(split.amount - 1, I64)), chunk)
    else:
        chunk = Var(f"{x}_chunk", I64)
        parts = Const(split.amount, I64)
        prelude.append(ir.Decl(chunk, ir.Bin("/", ir.sub(ir.add(count, parts), one), parts)))
        blocks = parts
    base = Var(f"{x}_base", I64)
    inner_loop = ir.For(
        inner,
        Const(0, I64),
        ir.minimum(chunk, ir.sub(hi, base)),
        [ir.Decl(loop.var, ir.add(base, inner)), *loop.body],
    )
    outer_loop = ir.For(
        outer, Const(0, I64), blocks, [ir.Decl(base, ir.add(lo, ir.mul(outer, chunk))), inner_loop]
    )
    return prelude, outer_loop, inner_loop


def _has_division(t: Term) -> bool:
    if isinstance(t, Op):
        return t.op == "/" or _has_division(t.left) or _has_division(t.right)
    if isinstance(t, Negate):
        return _has_division(t.operand)
    return False


def _check_divisors(t: Term, cin: CIN) -> None:
    """A sparse divisor would divide by its implicit zeros; refuse rather than guess."""
    if isinstance(t, Negate):
        _check_divisors(t.operand, cin)
    elif isinstance(t, Op):
        _check_divisors(t.left, cin)
        _check_divisors(t.right, cin)
        if t.op == "/":
            for n in operands(t.right):
                slot = cin.slots[n]
                if not slot.format.is_dense:
                    raise UnsupportedError(
                        f"division by sparse tensor {slot.tensor} (format '{slot.format}') would "
                        "divide by its implicit zeros; store the divisor dense"
                    )
