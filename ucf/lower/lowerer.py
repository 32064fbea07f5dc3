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
from dataclasses import dataclass, field, replace

from ucf.cin.notation import CIN
from ucf.cin.schedule import Applied
from ucf.errors import ScheduleError, UcfError, UnsupportedError
from ucf.format.format import Format, dense_format
from ucf.format.levels import WORKSPACE_LIST
from ucf.ir import nodes as ir
from ucf.ir.nodes import Array, Const, Param, Var
from ucf.lang import ast
from ucf.lang.affine import Affine
from ucf.lang.ast import accesses
from ucf.lower import sort, transforms
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


# The epoch at which a listed workspace's flags are cleared and the count restarts.
EPOCH_WRAP = 2**31 - 1


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
    level_vars: list[str]  # the loop each level is resolved at (an affine index's base)
    params: SlotParams
    level_idx: list[Affine]  # each level's index

    def affine(self, lvl: int) -> bool:
        return self.level_idx[lvl].single_variable is None

    def dim(self, lvl: int) -> Var:
        return self.params.dims[self.fmt.mode_order[lvl]]

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
    order: tuple[str, ...] = ()  # the loop order of this nest (a where's sides differ)
    ws: Workspace | None = None  # set in a precompute's producer: the leaf writes here
    where_done: bool = False  # below a precompute's where
    counter: Var | None = None  # a segment-local counter for the compressed output level
    cursors: dict = field(default_factory=dict)  # (operand, level) -> its sliding window's ends

    def copy(self) -> State:
        return replace(
            self,
            levels=dict(self.levels),
            pos=dict(self.pos),
            seg_end=dict(self.seg_end),
            cursors=dict(self.cursors),
        )


@dataclass
class Workspace:
    """A precompute's dense workspace, plus the list of touched coordinates when the
    consumer appends to a sparse output (so it walks only those, in order)."""

    name: str
    var: str  # the original index variable it is indexed by
    index: Var  # the variable it is indexed with (the original or a split's inner one)
    size: ir.Expr
    vals: Array
    flags: Array | None = None
    list: Array | None = None
    count: Var | None = None
    epoch: Var | None = None  # which use of the workspace flags[k] == epoch marks
    sort_tmp: Array | None = None  # the sort's scratch, as long as the list
    sort_buckets: Array | None = None  # the sort's counters, sort.BUCKETS long

    def allocations(self, assembling: bool) -> list[tuple[Array, ir.Expr]]:
        """The arrays a pass allocates, with their lengths.  The assemble pass only
        counts, so it needs neither the values nor the sort's scratch; the flags have one
        extra entry, which holds the epoch."""
        if self.list is None:
            return [] if assembling else [(self.vals, self.size)]
        listing = [(self.flags, ir.add(self.size, Const(1, I64))), (self.list, self.size)]
        if assembling:
            return listing
        scratch = [(self.sort_tmp, self.size), (self.sort_buckets, Const(sort.BUCKETS, I64))]
        return [(self.vals, self.size), *listing, *scratch]


@dataclass
class Lowered:
    """The kernel functions plus what the executor needs to call them."""

    compute: ir.Function
    assemble: ir.Function | None  # set for sparse outputs: counts entries per level
    helpers: list[ir.Function]  # internal functions the kernels call
    local_level: int | None  # compressed output level whose pos the assemble pass fills


@dataclass
class Where:
    """Where a precompute splits the nest into a producer and a consumer."""

    depth: int
    prod_term: Term
    cons_term: Term
    prod_vars: set[str]
    cons_vars: set[str]
    ws: Workspace
    split: tuple | None  # (outer, inner, factor, extent) when iw is a split's inner loop


class Lowerer:
    def __init__(
        self,
        cin: CIN,
        value_type: str,
        index_type: str,
        name: str = "kernel",
        applied: Applied | None = None,
    ):
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
        position = {v: k for k, v in enumerate(cin.order)}
        for n, a in enumerate(self.rhs_accesses):
            slot = cin.slots[n]
            if slot.name not in self.slot_params:
                self.slot_params[slot.name] = self._slot_params(
                    slot.name, slot.format, len(a.indices)
                )
            seen[a.tensor] = seen.get(a.tensor, 0) + 1
            label = a.tensor if counts[a.tensor] == 1 else f"{a.tensor}{seen[a.tensor]}"
            idx = [a.indices[m] for m in slot.format.mode_order]
            lv = [ix.base(position) for ix in idx]
            self.operands[n] = Operand(n, label, slot.format, lv, self.slot_params[slot.name], idx)
        self.out_fmt = cin.output_format
        out = stmt.lhs
        self.out_name = out.tensor
        self.out_vars = [i.single_variable for i in out.indices]
        self.out_level_vars = [out.indices[m].single_variable for m in self.out_fmt.mode_order]
        self.sparse_out = not self.out_fmt.is_dense
        self.out_params = self._slot_params(out.tensor, self.out_fmt, len(out.indices), output=True)
        self.counters = [Var(f"{out.tensor}{lvl}_size", I64) for lvl in range(self.out_fmt.order)]
        sparse_levels = [k for k, lvl in enumerate(self.out_fmt.levels) if not lvl.full]
        self.last_appended = max(sparse_levels, default=-1)
        self.assembling = False
        self._fresh = itertools.count()
        self.applied = applied
        self.pos_map = applied.pos if applied else {}
        self.fused = {f[0][0]: f for f in applied.fused} if applied else {}
        self.steps = list(applied.steps) if applied else []
        self.entries: dict[str, tuple[Var, int]] = {}
        self.workspaces: list[tuple[Array, ir.Expr]] = []  # allocated arrays, lengths
        self.local = self._local_level()
        self.use_acc = not (applied and self._interleaved(applied)) or self.sparse_out
        self.where = self._plan_where() if applied and applied.precompute else None

    def _local_level(self) -> int | None:
        """The one compressed output level below only dense ones, if that is the shape.

        Such an output (CSR and its kin) is counted per segment, so each
        segment's positions are known before the compute pass and its dense
        loops can run in parallel.
        """
        if not self.sparse_out:
            return None
        sparse = [k for k, lvl in enumerate(self.out_fmt.levels) if not lvl.full]
        if len(sparse) == 1 and self.out_fmt.levels[sparse[0]].letter == "C":
            return sparse[0]
        return None

    @staticmethod
    def _interleaved(applied: Applied) -> bool:
        """Whether the final loops interleave the loops of different original variables."""
        seen: list[str] = []
        for label in applied.loops:
            for o in applied.provenance.origins(label):
                if o in seen and seen[-1] != o:
                    return True
                if o not in seen:
                    seen.append(o)
        return False

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
            if self.local is not None:
                arr = self.out_params.levels[self.local]["pos"]
                params.append(
                    Param(
                        arr.name,
                        arr.elem,
                        True,
                        True,
                        role=("pos", self.out_name, self.local),
                        doc=f"out: entries under each parent of output level {self.local}",
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
            # The assemble pass has no output storage; its dense levels' sizes are extents.
            dims = zip(self.out_params.dims, self.out_vars, strict=True)
            body = [ir.Decl(d, self.extents[v]) for d, v in dims]
            body += self._function_body()
            body += [
                ir.Store(self._counts_array(), Const(lvl, I64), c)
                for lvl, c in enumerate(self.counters)
            ]
            assemble = ir.Function(
                f"{self.name}_assemble",
                self._params(True),
                self._scheduled(body),
                doc="Count the entries of each output level.",
            )
            self.assembling = False
        body = self._scheduled(self._function_body())
        compute = ir.Function(
            self.name, self._params(False), body, doc=f"Compute {self.cin.statement}."
        )
        helpers = [sort.sort_function()] if self.where and self.where.ws.list else []
        return Lowered(compute, assemble, helpers, self.local)

    def _scheduled(self, body: list[ir.Stmt]) -> list[ir.Stmt]:
        """Apply the loop transformations of the schedule to a built nest."""
        if self.applied is None:
            return body
        for ws, size in self.workspaces:
            body.insert(0, ir.Alloc(ws, size))
            body.append(ir.Free(ws))
        parallel_out: set[str] = set()
        if self.local is not None:
            parallel_out = set(self.out_level_vars[: self.local])
        nest = transforms.Nest(
            body,
            self.applied.provenance,
            set(self.out_vars),
            self.out_params.vals.name,
            self.sparse_out,
            parallel_out,
            entries=dict(self.entries),
            workspaces=[ws for ws, _ in self.workspaces],
            partial=self.assembling,
            trailing_out=set(self.out_level_vars[self.last_appended + 1 :]),
        )
        transforms.apply(nest, self.steps, self.applied.parallel)
        self.entries.clear()
        return nest.body

    def _counts_array(self) -> Array:
        return Array(f"{self.out_name}_counts", I64, True)

    def _function_body(self) -> list[ir.Stmt]:
        body: list[ir.Stmt] = (
            [ir.Decl(c, Const(0, I64)) for c in self.counters] if self.sparse_out else []
        )
        state = State(order=tuple(self.cin.order))
        for n in self.operands:
            state.levels[n] = 0
            state.pos[n] = Const(0, I64)
        self.workspaces = []
        if self.where is not None:
            self.workspaces = self.where.ws.allocations(self.assembling)
        body += self._at_depth(self.term, state)
        return body

    # --------------------------------------------------------------- descent
    def _at_depth(self, term: Term, st: State) -> list[ir.Stmt]:
        order = st.order
        d = st.depth
        if self.where and not st.where_done and st.ws is None and d == self.where.depth:
            return self._where(st)
        remaining = order[d:]
        out_vars = [st.ws.var] if st.ws else self.out_vars
        out_bound = all(v in order[:d] for v in out_vars)
        listing = st.ws is not None and st.ws.list is not None
        if self.assembling and st.pending is None and not listing:
            # Counting is done once every output coordinate that gets appended is placed.
            if out_bound or (st.ws is None and st.out_level > self.last_appended):
                return []
        if d == len(order):
            return self._leaf(term, st)
        use_acc = self.use_acc and st.ws is None
        if out_bound and st.acc is None and remaining and use_acc:
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
            counter = self._counter(st, lvl)
            insert: list[ir.Stmt] = [ir.Decl(q, counter)]
            if not self.assembling:
                crd = self.out_params.levels[lvl]["crd"]
                insert += [
                    ir.Store(crd, q, ir.cast(coord, self.it)),
                    ir.Store(self.out_params.vals, q, acc),
                ]
            insert.append(ir.Assign(counter, ir.add(counter, Const(1, I64))))
            return [
                ir.Decl(acc, Const(0, self.vt)),
                ir.Decl(hit, Const(False, "i1")),
                *self._loop(term, inner),
                ir.If(hit, insert),
            ]
        return self._loop(term, st)

    def _counter(self, st: State, lvl: int) -> Var:
        if lvl == self.local and st.counter is not None:
            return st.counter
        return self.counters[lvl]

    def _leaf(self, term: Term, st: State) -> list[ir.Stmt]:
        if st.ws is not None:
            return self._ws_leaf(term, st)
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
        outer = st.order[: st.depth]
        once = self.cin.statement.op == "=" and all(v in self.out_vars for v in outer)
        if self.sparse_out:
            index = st.out_pos
        else:
            coords = [Var(v, I64) for v in self.out_level_vars]
            index = self._dense_index(self.out_params, self.out_fmt, coords)
        return ir.Store(self.out_params.vals, index, value, accumulate=not once)

    def _dense_index(self, sp: SlotParams, fmt: Format, coords: list[ir.Expr]) -> ir.Expr:
        index: ir.Expr = Const(0, I64)
        for lvl, c in enumerate(coords):
            index = ir.add(ir.mul(index, sp.dims[fmt.mode_order[lvl]]), c)
        return index

    @staticmethod
    def _affine(a: Affine) -> ir.Expr:
        """An index's value from the loop variables that are bound where it is read."""
        e: ir.Expr = Const(a.const, I64)
        for v, c in a.terms:
            e = ir.add(e, ir.mul(Const(c, I64), Var(v, I64)))
        return e

    def _value(self, t: Term, st: State) -> ir.Expr:
        if isinstance(t, Opnd):
            op = self.operands[t.n]
            if self.where and t.n == self.where_n:
                return ir.Load(self.where.ws.vals, self.where.ws.index)
            if op.dense:
                coords = [self._affine(ix) for ix in op.level_idx]
                return ir.Load(op.params.vals, self._dense_index(op.params, op.fmt, coords))
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
        v = st.order[st.depth]
        if v in self.fused and st.ws is None:
            return self._fused_loop(term, st, *self.fused[v])
        sparse, located = self._sparse_here(v, st)
        used = operands(term)
        present = [n for n in sparse if n in used]
        guards = self._guards(v, st, used, located)
        points = lattice(term, lambda n: n in present or n in guards)
        top = points[0]
        stmts: list[ir.Stmt] = []
        out_kind = self._out_kind(v, st)
        local = out_kind == "C" and st.out_level == self.local and st.ws is None
        prefix: list[ir.Stmt] = []
        pos_arr = self.out_params.levels[self.local]["pos"] if local else None
        if local:
            st = st.copy()
            st.counter = Var(f"{self.out_name}{self.local}_at", I64)
            start = Const(0, I64) if self.assembling else ir.cast(ir.Load(pos_arr, st.out_pos), I64)
            prefix = [ir.Decl(st.counter, start)]
        st, slide = self._cursors(v, st, used)
        prefix += slide
        iters = {n: self._iterator(n, v, st) for n in present}
        coord = Var(v, I64)
        label = self._label(v, st)
        # A point that only guarded operands make up needs every coordinate visited.
        guard_only = any(p.iters and not p.iters & set(iters) for p in points)
        full = top.full or (guard_only and bool(iters))
        drives = len(iters) == 1 and not full and next(iter(iters.values())).unique
        self._check_pos(v, st, iters, full, drives)
        live = set(iters) | set(guards)
        if drives:
            # One iterator drives: a counted loop over its positions, which vectorizes.
            it = next(iter(iters.values()))
            body = [ir.Decl(coord, self._it_coord(it))]
            flags = self._guard_flags(guards, guards)
            inner = [*flags.values()]
            matches = {n: f.var for n, f in flags.items()}
            inner += self._cases(term, st, iters, located, coord, live, matches, full=False)
            if it.stride > 1:
                inner = [ir.If(self._on_stride(it), inner)]
            stmts += it.setup
            stmts.append(ir.For(it.pos, it.begin, it.end_expr, body + inner, label=label))
        elif full:
            for it in iters.values():
                stmts += it.init
            body = self._full_body(term, st, iters, located, coord, guards)
            stmts.append(ir.For(coord, Const(0, I64), self.extents[v], body, label=label))
        elif not iters:
            # Only guarded (affine, located) operands: the loop runs over the range
            # every point's common guards allow, and checks the others.
            common = set(guards)
            for point in points:
                if point.iters:
                    common &= point.iters
            lo, hi = self._guard_range(v, [g for n in common for g in guards[n]])
            flags = self._guard_flags(guards, set(guards) - common)
            body = [*flags.values()]
            matches = {n: f.var for n, f in flags.items()}
            body += self._cases(term, st, {}, located, coord, live - common, matches, full=True)
            stmts.append(ir.For(coord, lo, hi, body, label=label))
        else:
            for it in iters.values():
                stmts += it.init
            done: set[frozenset[int]] = set()
            for point in points:
                key = frozenset(point.iters & set(iters))
                if not key or key in done:
                    continue
                done.add(key)
                point_live = key | {
                    n for q in points if q.iters & set(iters) == key for n in q.iters
                }
                flags = self._guard_flags(guards, point_live)
                absent = set(guards) - point_live
                stmts += self._point_loop(
                    term, st, iters, located, coord, key, point_live, flags, absent, label
                )
        if local:
            if self.assembling:
                stmts.append(
                    ir.Store(
                        pos_arr, ir.add(st.out_pos, Const(1, I64)), ir.cast(st.counter, self.it)
                    )
                )
            return prefix + stmts
        if out_kind == "C" and not self.assembling and st.ws is None:
            lvl = st.out_level
            stmts.append(
                ir.Store(
                    self.out_params.levels[lvl]["pos"],
                    ir.add(st.out_pos, Const(1, I64)),
                    ir.cast(self.counters[lvl], self.it),
                )
            )
        return prefix + stmts

    # ------------------------------------------------------- affine accesses
    def _cursors(self, u: str, st: State, used: set[int]) -> tuple[State, list[ir.Stmt]]:
        """Cursors for the affine windows that slide forward as ``u`` advances.

        When ``u`` is the innermost variable of a compressed level's window
        offset and that level's parent is fixed across the loop over ``u``,
        each window starts (and ends) at or after the previous one, so its
        search resumes from there: a linear scan whose total over the loop is
        the segment's length.  Only when ``u`` runs serially in increasing
        order, as in an untransformed loop nest.
        """
        if self.applied is not None and (
            self.applied.provenance.rel
            or any(u in self.applied.provenance.origins(p) for p in self.applied.parallel)
        ):
            return st, []
        position = {v: k for k, v in enumerate(st.order)}
        decls: list[ir.Stmt] = []
        cursors = dict(st.cursors)
        for n, op in self.operands.items():
            lvl = st.levels[n]
            if n not in used or op.dense or lvl >= op.fmt.order or not op.affine(lvl):
                continue
            a = op.level_idx[lvl]
            rest = a.without(op.level_vars[lvl])
            kind = op.fmt.levels[lvl]
            if (
                not rest.variables
                or rest.base(position) != u
                or rest.coefficient(u) <= 0
                or kind.full
                or not op.fmt.unique(lvl)
            ):
                continue
            begin, _ = kind.bounds(op.params.levels[lvl], st.pos[n], st.seg_end.get(n), op.dim(lvl))
            pair = tuple(Var(f"{op.name}{lvl}_{u}_cursor{k}", I64) for k in range(2))
            decls += [ir.Decl(c, ir.cast(begin, I64)) for c in pair]
            cursors[(n, lvl)] = pair
        if decls:
            st = st.copy()
            st.cursors = cursors
        return st, decls

    def _guards(self, v: str, st: State, used: set[int], located: list[int]) -> dict:
        """Operands read through a located level whose affine index has base ``v``.

        Such a coordinate can fall outside the level, where the operand reads
        as zero (implicit padding): at ``v`` the operand may be absent, like a
        sparse one, and its guard says where it is present.
        """
        guards: dict[int, list[tuple[Affine, ir.Expr]]] = {}
        for n, op in self.operands.items():
            if n not in used:
                continue
            if op.dense:
                levels = [k for k, b in enumerate(op.level_vars) if b == v and op.affine(k)]
            elif n in located and op.affine(st.levels[n]):
                levels = [st.levels[n]]
            else:
                continue
            if levels:
                guards[n] = [(op.level_idx[k], op.dim(k)) for k in levels]
        return guards

    def _guard_flags(self, guards: dict, which) -> dict[int, ir.Decl]:
        flags = {}
        for n, conds in guards.items():
            if n not in which:
                continue
            ok: ir.Expr = Const(True, "i1")
            for a, dim in conds:
                c = self._affine(a)
                ok = ir.land(ok, ir.land(ir.Cmp(">=", c, Const(0, I64)), ir.Cmp("<", c, dim)))
            var = Var(f"{self.operands[n].name}_in{next(self._fresh)}", "i1")
            flags[n] = ir.Decl(var, ok)
        return flags

    def _guard_range(self, v: str, conds: list) -> tuple[ir.Expr, ir.Expr]:
        """The values of ``v`` for which every guard holds: ``s*v + off`` in [0, dim)."""
        lo: ir.Expr = Const(0, I64)
        hi: ir.Expr = self.extents[v]
        for a, dim in conds:
            s = a.coefficient(v)
            off = self._affine(a.without(v))
            if s > 0:
                first = _ceildiv(ir.Neg(off), s)
                end = _ceildiv(ir.sub(dim, off), s)
            else:
                first = ir.add(_floordiv(ir.sub(off, dim), -s), Const(1, I64))
                end = ir.add(_floordiv(off, -s), Const(1, I64))
            lo = ir.Bin("max", lo, first)
            hi = ir.minimum(hi, end)
        return lo, hi

    def _window(
        self, it: _Iterator, lvl: int, v: str, begin: ir.Expr, end: ir.Expr, st: State
    ) -> None:
        """Iterate only the positions of a compressed level whose coordinates lie in the
        window ``[off, off + s*|v|)`` of the index ``s*v + off``.

        Each end is found by binary search, unless the window's interval over
        the loops around it shows that end is always outside the stored
        range; that test only reads extents, so it is decided once per call.
        """
        op = self.operands[it.n]
        a = op.level_idx[lvl]
        s = a.coefficient(v)
        rest = a.without(v)
        off = self._affine(rest)
        low, high = (self._affine(b) for b in rest.interval(lambda u: self.extents[u].name))
        span = ir.mul(Const(s, I64), self.extents[v])  # the window's width
        lo_key, hi_key = off, ir.add(off, span)
        dim = op.dim(lvl)
        pb, pe = Var(f"{it.pos.name}_seg", I64), Var(f"{it.end.name}_seg", I64)
        wb, we = Var(f"{it.pos.name}_w0", I64), Var(f"{it.pos.name}_w1", I64)
        setup: list[ir.Stmt] = [ir.Decl(pb, begin), ir.Decl(pe, end)]
        if (it.n, lvl) in st.cursors:
            pair = st.cursors[(it.n, lvl)]
            for w, key, cur in zip((wb, we), (lo_key, hi_key), pair, strict=True):
                crd = ir.cast(it.kind.coordinate(it.arrays, cur), I64)
                step = ir.Assign(cur, ir.add(cur, Const(1, I64)))
                setup += [
                    ir.While(ir.land(ir.Cmp("<", cur, pe), ir.Cmp("<", crd, key)), [step]),
                    ir.Decl(w, cur),
                ]
        else:
            reach = ir.add(low, span)
            # (result, key, search from, value when no search is needed, "search needed")
            for w, key, first, outside, needed in (
                (wb, lo_key, pb, pb, ir.Cmp(">", high, Const(0, I64))),
                (we, hi_key, wb, pe, ir.Cmp("<", reach, dim)),
            ):
                search = it.kind.search(it.arrays, first, pe, key, w)
                setup += [ir.Decl(w, outside), ir.If(needed, search)]
        it.setup = setup
        it.begin, it.end_expr = wb, we
        it.stride, it.offset = s, off

    @staticmethod
    def _past_offset(it: _Iterator) -> ir.Expr:
        """The stored coordinate minus an affine index's offset: ``stride * v``."""
        c = ir.cast(it.kind.coordinate(it.arrays, it.pos), I64)
        return c if it.offset is None else ir.sub(c, it.offset)

    def _it_coord(self, it: _Iterator) -> ir.Expr:
        """The iterator's coordinate in its loop's variable (undoing an affine index)."""
        c = self._past_offset(it)
        return c if it.stride == 1 else ir.Bin("/", c, Const(it.stride, I64))

    def _on_stride(self, it: _Iterator, on: bool = True) -> ir.Expr:
        rem = ir.Bin("%", self._past_offset(it), Const(it.stride, I64))
        return ir.Cmp("==" if on else "!=", rem, Const(0, I64))

    def _label(self, v: str, st: State) -> str:
        if self.where and (st.ws is not None or st.where_done) and v == self.where.ws.var:
            return self.applied.precompute[0].wvar
        if v in self.pos_map:
            return self.pos_map[v][0]
        return v

    def _check_pos(self, v: str, st: State, iters: dict, full: bool, drives: bool) -> None:
        if v not in self.pos_map:
            return
        vpos, tensor = self.pos_map[v]
        cmd = f"pos({v}, {vpos}, {tensor})"
        names = [self.cin.slots[n].tensor if n in self.cin.slots else "" for n in iters]
        if full:
            why = "a sum with a dense term"
            if st.where_done:
                why = f"the precompute's consumer walks the dense workspace {self.where.ws.name}"
            raise ScheduleError(
                f"{cmd}: the loop over {v} also visits coordinates where {tensor} is zero "
                f"({why}), so {tensor}'s positions do not cover it"
            )
        if names == [tensor] and not next(iter(iters.values())).unique:
            raise ScheduleError(
                f"{cmd}: {tensor}'s level for {v} is not unique (the singleton level below "
                f"it repeats each coordinate), so its positions are not one per {v}; fuse "
                f"{v} with the variables below it and pos the fused loop"
            )
        if len(iters) > 1:
            raise ScheduleError(
                f"{cmd}: {v} co-iterates {' and '.join(names)}; pos needs {tensor} to drive the "
                f"loop over {v} alone"
            )
        if not drives or names != [tensor]:
            raise ScheduleError(
                f"{cmd}: the loop over {v} is not driven by {tensor}'s positions here (at {v}, "
                f"{tensor}'s level is dense or not reached)"
            )

    # -------------------------------------------------------------- precompute
    def _plan_where(self) -> Where:
        """Place a precompute's where as high in the nest as its workspace allows.

        Below the where, the producer and the consumer may share no variable but
        the workspace's, or the workspace would need more dimensions.  A sparse
        output needs every reduction variable inside the producer, so the
        consumer writes each output entry once.
        """
        from ucf.lang.parser import parse_statement

        pc = self.applied.precompute[0]
        prov = self.applied.provenance
        cmd = f"precompute({pc.expr}, {pc.var}, {pc.wvar}, {pc.name})"
        origins = prov.origins(pc.var)
        if len(origins) != 1:
            raise ScheduleError(f"{cmd}: {pc.var} iterates several variables; use one")
        i = origins[0]
        split = None
        rel = prov.rel.get(pc.var)
        if rel is not None and (rel.kind, rel.role) == ("split", "inner"):
            split = self._ws_split(cmd, pc.var, i)
        elif rel is not None:
            raise ScheduleError(
                f"{cmd}: {prov.describe(pc.var)}; precompute over an index variable or the "
                "inner loop of a split"
            )
        try:
            stmt = parse_statement(f"{pc.name}({i}) = {pc.expr}")
        except UcfError as e:
            raise ScheduleError(f"{cmd}: the expression does not parse: {e}") from None
        factors = _factors(self.term)
        taken: list[int] = []
        for a in _ast_factors(stmt.rhs):
            match = next(
                (
                    t.n
                    for t in factors
                    if isinstance(t, Opnd)
                    and t.n not in taken
                    and isinstance(a, ast.Access)
                    and str(self.rhs_accesses[t.n]) == str(a)
                ),
                None,
            )
            if match is None:
                raise ScheduleError(
                    f"{cmd}: {a} is not a factor of the right-hand side "
                    f"{self.cin.statement.rhs}; precompute a product of its factors"
                )
            taken.append(match)
        rest = [t for t in factors if not (isinstance(t, Opnd) and t.n in taken)]
        if len(factors) == 1 and taken:
            rest = []
        prod_vars = {
            v for n in taken for idx in self.rhs_accesses[n].indices for v in idx.variables
        }
        if i not in prod_vars:
            raise ScheduleError(f"{cmd}: {pc.expr} does not use {i}")
        cons_vars = set(self.out_vars) | {i}
        for t in rest:
            for n in operands(t):
                cons_vars |= {v for idx in self.rhs_accesses[n].indices for v in idx.variables}
        order = self.cin.order
        reductions = set(self.cin.reduction_vars)
        depth = None
        for d in range(len(order)):
            below = set(order[d:])
            if i not in below or not (prod_vars & cons_vars & below) <= {i}:
                continue
            if self.sparse_out and reductions & set(order[:d]):
                continue
            if split is not None and order[d] != i:
                continue
            depth = d
            break
        if depth is None:
            raise ScheduleError(
                f"{cmd}: with the loop order {', '.join(order)} the producer and the consumer "
                f"would share variables other than {i} below any placement; reorder the loops "
                f"so that {i} and the variables only {pc.expr} uses are innermost"
            )
        W = len(self.rhs_accesses)
        self.where_n = W
        size: ir.Expr = self.extents[i] if split is None else Const(split[2], I64)
        index = Var(i if split is None else pc.var, I64)
        vals = Array(pc.name, self.vt, True)
        ws = Workspace(pc.name, i, index, size, vals)
        if self.sparse_out:
            below = [v for v in order[depth:] if v in cons_vars]
            if below != [i]:
                raise ScheduleError(
                    f"{cmd}: the consumer would loop over {', '.join(below)}; with a sparse "
                    f"output it must loop over {i} only"
                )
            ws.flags = Array(f"{pc.name}_seen", "i32", True)
            ws.list = Array(f"{pc.name}_list", I64, True)
            ws.count = Var(f"{pc.name}_count", I64)
            ws.epoch = Var(f"{pc.name}_epoch", "i32")
            ws.sort_tmp = Array(f"{pc.name}_tmp", I64, True)
            ws.sort_buckets = Array(f"{pc.name}_buckets", I64, True)
            fmt = Format((WORKSPACE_LIST,), (0,))
            params = SlotParams([size], [{"crd": ws.list, "count": ws.count}], vals)
        else:
            fmt = dense_format(1)
            params = SlotParams([size], [{}], vals)
        self.operands[W] = Operand(W, pc.name, fmt, [i], params, [Affine.var(i)])
        prod = _product([Opnd(n) for n in taken])
        cons = _product([*rest, Opnd(W)])
        return Where(depth, prod, cons, prod_vars, cons_vars, ws, split)

    def _ws_split(self, cmd: str, var: str, i: str) -> tuple:
        """The (outer, inner, factor, extent) of a workspace over a split's inner loop."""
        prov = self.applied.provenance
        rel = prov.rel[var]
        parent = rel.parents[0]
        outer = next(
            v
            for v, r in prov.rel.items()
            if r.kind == "split" and r.parents == rel.parents and r.role == "outer"
        )
        prel = prov.rel.get(parent)
        if parent == i:
            extent: ir.Expr = self.extents[i]
        elif prel is not None and prel.kind == "bound" and prel.parents == (i,):
            extent = Const(prel.amount, I64)
        else:
            raise ScheduleError(f"{cmd}: {prov.describe(parent)}; split {i} or its bound")
        self.steps = [
            c
            for c in self.steps
            if not (c.name == "split" and c.args[0] == parent)
            and not (c.name == "bound" and c.args[1] == parent)
        ]
        return outer, var, rel.amount, extent

    def _where(self, st: State) -> list[ir.Stmt]:
        wh = self.where
        ws = wh.ws
        d = st.depth
        prod = st.copy()
        prod.order = st.order[:d] + tuple(v for v in st.order[d:] if v in wh.prod_vars)
        prod.ws = ws
        cons = st.copy()
        cons.order = st.order[:d] + tuple(v for v in st.order[d:] if v in wh.cons_vars)
        cons.where_done = True
        start: list[ir.Stmt] = []
        if ws.list is None:
            z = Var(f"{ws.name}_z", I64)
            if not self.assembling:
                start.append(
                    ir.For(z, Const(0, I64), ws.size, [ir.Store(ws.vals, z, Const(0, self.vt))])
                )
        else:
            start += self._ws_epoch(ws)
        produce = self._at_depth(wh.prod_term, prod)
        if ws.list is not None and not self.assembling:
            sort_args = [ws.list, ws.count, ws.sort_tmp, ws.sort_buckets, ws.size]
            produce.append(ir.Call(sort.NAME, sort_args))
        consume = self._at_depth(wh.cons_term, cons)
        if wh.split is None:
            return start + produce + consume
        outer, inner, factor, extent = wh.split
        base = Var(f"{ws.var}_base", I64)
        f = Const(factor, I64)

        def tile(stmts: list[ir.Stmt]) -> list[ir.Stmt]:
            loop = stmts[-1] if stmts else None
            if any(isinstance(s, ir.For) and s.var.name == ws.var for s in stmts[:-1]):
                raise ScheduleError(
                    f"precompute over {inner}: the rest of the statement sums {ws.name} over "
                    f"{ws.var} into a scalar that is stored once after the loop, so the loop "
                    f"cannot be cut into tiles; precompute over {ws.var} itself"
                )
            if not (isinstance(loop, ir.For) and loop.var.name == ws.var):
                raise ScheduleError(
                    f"precompute over {inner}: the loop over {ws.var} walks a sparse operand; "
                    "a workspace over a split's inner loop needs a dense loop"
                )
            body = [ir.Decl(loop.var, ir.add(base, Var(inner, I64))), *loop.body]
            end = ir.minimum(f, ir.sub(extent, base))
            return [*stmts[:-1], ir.For(Var(inner, I64), Const(0, I64), end, body, label=inner)]

        blocks = ir.Bin("/", ir.add(extent, Const(factor - 1, I64)), f)
        body = [ir.Decl(base, ir.mul(Var(outer, I64), f)), *start, *tile(produce), *tile(consume)]
        return [ir.For(Var(outer, I64), Const(0, I64), blocks, body, label=outer)]

    @staticmethod
    def _ws_epoch(ws: Workspace) -> list[ir.Stmt]:
        """Start a use of a listed workspace by moving to a new epoch.

        An entry is touched in this use when its flag equals the epoch, and a first
        touch zeroes the value, so nothing walks the list afterwards to reset flags and
        values: that second pass of random writes cost a tenth of Gustavson SpGEMM.
        The epoch lives in the flags' extra last entry so it is private to a thread
        exactly when the flags are; when it would overflow, the flags are cleared.
        """
        i32 = "i32"
        last = Const(EPOCH_WRAP, i32)
        z = Var(f"{ws.name}_z", I64)
        wrap = [
            ir.For(z, Const(0, I64), ws.size, [ir.Store(ws.flags, z, Const(0, i32))]),
            ir.Assign(ws.epoch, Const(1, i32)),
        ]
        return [
            ir.Decl(ws.count, Const(0, I64)),
            ir.Decl(ws.epoch, ir.add(ir.Load(ws.flags, ws.size), Const(1, i32))),
            ir.If(ir.Cmp("==", ws.epoch, last), wrap),
            ir.Store(ws.flags, ws.size, ws.epoch),
        ]

    def _ws_leaf(self, term: Term, st: State) -> list[ir.Stmt]:
        ws = st.ws
        idx = ws.index
        stmts: list[ir.Stmt] = []
        if ws.list is not None:
            first = [
                ir.Store(ws.flags, idx, ws.epoch),
                ir.Store(ws.list, ws.count, idx),
                ir.Assign(ws.count, ir.add(ws.count, Const(1, I64))),
            ]
            if not self.assembling:
                first.append(ir.Store(ws.vals, idx, Const(0, self.vt)))
            stmts.append(ir.If(ir.Cmp("!=", ir.Load(ws.flags, idx), ws.epoch), first))
        if not self.assembling:
            stmts.append(ir.Store(ws.vals, idx, self._value(term, st), accumulate=True))
        return stmts

    # ------------------------------------------------------------- fused pos
    def _fused_loop(self, term: Term, st: State, fvars: tuple, label: str, tensor: str):
        """One loop over the positions of ``tensor``'s deepest fused level.

        Each iteration recovers the parent positions and coordinates above it.
        A compressed parent is found by binary search at the start of a range
        (the loop's start, or each block's once it is split) and then advanced
        incrementally, so a block costs one search plus constant work per
        nonzero.
        """
        cmd = f"pos over {', '.join(fvars)} ({label}, {tensor})"
        used = operands(term)
        n = next(
            (
                x
                for x, op in self.operands.items()
                if x in self.cin.slots
                and self.cin.slots[x].tensor == tensor
                and x in used
                and not op.dense
                and st.levels[x] < op.fmt.order
                and op.level_vars[st.levels[x]] == fvars[0]
            ),
            None,
        )
        if n is None:
            raise ScheduleError(f"{cmd}: {tensor} does not drive the loop over {fvars[0]} here")
        op = self.operands[n]
        a = st.levels[n]
        m = len(fvars)
        b = a + m - 1
        if op.level_vars[a : b + 1] != list(fvars):
            raise ScheduleError(f"{cmd}: {tensor} does not store {', '.join(fvars)} in that order")
        affine = [str(op.level_idx[k]) for k in range(a, b + 1) if op.affine(k)]
        if affine:
            raise ScheduleError(
                f"{cmd}: {tensor}'s index '{affine[0]}' is affine; pos over fused levels needs "
                "plain indices"
            )
        if self.sparse_out:
            raise ScheduleError(
                f"{cmd}: a sparse output cannot be appended from a loop over fused nonzeros"
            )
        if lattice(term, lambda x: x == n)[0].full:
            raise ScheduleError(
                f"{cmd}: the loop over {fvars[0]} also visits coordinates where {tensor} is zero"
            )
        cur = st.copy()
        located_stmts: list[ir.Stmt] = []
        for v in fvars:
            sparse, located = self._sparse_here(v, cur)
            others = [x for x in sparse if x in used and x != n]
            if others:
                names = ", ".join(self.cin.slots[x].tensor for x in others)
                raise ScheduleError(
                    f"{cmd}: {v} also co-iterates {names}; pos needs {tensor} alone"
                )
            for x in located:
                located_stmts.append(self._locate(x, cur, cur))
            cur.levels[n] += 1
        arrays = op.params.levels
        kinds = op.fmt.levels
        dims = [op.params.dims[op.fmt.mode_order[lvl]] for lvl in range(op.fmt.order)]
        pre: list[ir.Stmt] = []
        ranges: dict[int, tuple[Var, Var]] = {}
        lo, hi = kinds[a].bounds(arrays[a], st.pos[n], st.seg_end.get(n), dims[a])
        for lvl in range(a, b + 1):
            if lvl > a:
                lo, hi = kinds[lvl].child_range(arrays[lvl], *ranges[lvl - 1], dims[lvl])
            rng = (Var(f"{label}_lo{lvl}", I64), Var(f"{label}_hi{lvl}", I64))
            pre += [ir.Decl(rng[0], ir.cast(lo, I64)), ir.Decl(rng[1], ir.cast(hi, I64))]
            ranges[lvl] = rng
        p = Var(label, I64)
        first = Var(f"{label}_first", I64)
        entry: list[ir.Stmt] = []
        body: list[ir.Stmt] = []
        parents: dict[int, ir.Expr] = {b: p}
        child, child_first = p, first
        for lvl in range(b, a, -1):
            letter = kinds[lvl].letter
            q = Var(f"{label}_q{lvl - 1}", I64)
            if letter == "C":
                posarr = arrays[lvl]["pos"]
                entry += _segment_search(posarr, child_first, ranges[lvl - 1], q)
                nxt = ir.add(q, Const(1, I64))
                body.append(
                    ir.While(
                        ir.Cmp("<=", ir.cast(ir.Load(posarr, nxt), I64), child), [ir.Assign(q, nxt)]
                    )
                )
                child_first = q
            elif letter == "U":
                body.append(ir.Decl(q, ir.Bin("/", child, dims[lvl])))
                qf = Var(f"{label}_f{lvl - 1}", I64)
                entry.append(ir.Decl(qf, ir.Bin("/", child_first, dims[lvl])))
                child_first = qf
            else:
                body.append(ir.Decl(q, child))
            parents[lvl - 1] = q
            child = q
        for lvl in range(a, b + 1):
            pos_l = parents[lvl]
            if kinds[lvl].letter == "U":
                parent = st.pos[n] if lvl == a else parents[lvl - 1]
                coord = ir.sub(pos_l, ir.mul(parent, dims[lvl]))
            else:
                coord = ir.cast(kinds[lvl].coordinate(arrays[lvl], pos_l), I64)
            body.append(ir.Decl(Var(fvars[lvl - a], I64), coord))
        body += located_stmts
        inner = cur
        inner.depth = st.depth + m
        inner.pos[n] = p
        inner.seg_end[n] = None
        body += self._at_depth(term, inner)
        loop = ir.For(p, ranges[b][0], ranges[b][1], body, label=label)
        self.entries[label] = (first, len(entry) + 1)
        return [*pre, ir.Decl(first, ranges[b][0]), *entry, loop]

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
        if n in self.cin.slots and self.pos_map.get(v, ("", ""))[1] == self.cin.slots[n].tensor:
            p = Var(self.pos_map[v][0], I64)
        e = Var(f"p{base}_end", I64)
        it = _Iterator(n, p, e, Var(f"{v}{op.name}", I64), kind, arrays, unique=op.fmt.unique(lvl))
        it.begin, it.end_expr = ir.cast(begin, I64), ir.cast(end, I64)
        if op.affine(lvl):
            a = op.level_idx[lvl]
            access = self.rhs_accesses[n] if n < len(self.rhs_accesses) else a
            if not (it.unique and kind.ordered) or kind.branchless:
                raise UnsupportedError(
                    f"access {access}: affine index '{a}' on a {kind.name} level that is not "
                    "unique and ordered; store that level compressed (C) below unique levels, "
                    "or dense (U)"
                )
            if a.coefficient(v) < 0:
                raise UnsupportedError(
                    f"access {access}: affine index '{a}' on a compressed level decreases with "
                    f"{v}, its innermost loop; store that level dense (U) or reorder the loops"
                )
            self._window(it, lvl, v, it.begin, it.end_expr, st)
        it.init = [*it.setup, ir.Decl(p, it.begin), ir.Decl(e, it.end_expr)]
        if it.stride > 1:
            it.skip = [
                ir.While(
                    ir.land(ir.Cmp("<", p, e), self._on_stride(it, False)),
                    [ir.Assign(p, ir.add(p, Const(1, I64)))],
                )
            ]
            it.init += it.skip
        if not it.unique:
            it.seg = Var(f"p{base}_seg", I64)
        return it

    def _coordinate_stmts(self, it: _Iterator) -> list[ir.Stmt]:
        stmts: list[ir.Stmt] = [ir.Decl(it.coord, self._it_coord(it))]
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

    def _full_body(self, term, st, iters, located, coord, guards) -> list[ir.Stmt]:
        """A dense loop over the dimension; sparse iterators are checked for a match."""
        flags = self._guard_flags(guards, guards)
        body: list[ir.Stmt] = [*flags.values()]
        matches: dict[int, ir.Expr] = {n: f.var for n, f in flags.items()}
        for n, it in iters.items():
            m = Var(f"{it.coord.name}_hit", "i1")
            ok = ir.land(ir.Cmp("<", it.pos, it.end), ir.Cmp("==", self._it_coord(it), coord))
            body.append(ir.Decl(m, ok))
            if not it.unique:
                seg_stmts = self._coordinate_stmts(it)
                body.append(seg_stmts.pop(1))  # the run end, declared where cases can see it
                body.append(ir.If(m, seg_stmts))
            matches[n] = m
        live = set(iters) | set(guards)
        body += self._cases(term, st, iters, located, coord, live, matches, full=True)
        for n, it in iters.items():
            body.append(ir.If(matches[n], [ir.Assign(it.pos, self._advance(it)), *it.skip]))
        return body

    def _point_loop(
        self, term, st, iters, located, coord, key, live, flags, absent, label
    ) -> list[ir.Stmt]:
        """A co-iteration ``while`` over the iterators in ``key``; ``live`` adds the guarded
        operands that may match with them, each checked by its flag."""
        its = [iters[n] for n in sorted(key)]
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
        body += flags.values()
        matches: dict[int, ir.Expr] = {n: f.var for n, f in flags.items()}
        for it in its:
            m = Var(f"{it.coord.name}_hit", "i1")
            body.append(ir.Decl(m, ir.Cmp("==", it.coord, coord)))
            matches[it.n] = m
        body += self._cases(term, st, iters, located, coord, live, matches, False, absent)
        for it in its:
            step = [ir.Assign(it.pos, self._advance(it)), *it.skip]
            body += step if len(its) == 1 else [ir.If(matches[it.n], step)]
        return [ir.While(cond, body, label=label)]

    def _cases(
        self, term, st, iters, located, coord, live: set[int], matches, full: bool, absent=()
    ):
        """One branch per set of matching iterators and guards, largest set first.

        Iterators and guarded operands outside the matching set, and those in
        ``absent``, read as zero in a branch.
        """
        all_here = set(iters) | live | set(absent)
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

    def _locate(self, n: int, st: State, inner: State) -> ir.Stmt:
        """Find operand ``n``'s position in its next (dense) level; an affine coordinate
        out of range is excluded by the loop's guard before the position is used."""
        op = self.operands[n]
        lvl = st.levels[n]
        p = Var(f"p{op.name}{lvl}", I64)
        coord = self._affine(op.level_idx[lvl])
        decl = ir.Decl(p, op.fmt.levels[lvl].locate(st.pos[n], coord, op.dim(lvl)))
        inner.levels[n] = lvl + 1
        inner.pos[n] = p
        inner.seg_end[n] = None
        return decl

    def _case_body(self, term, st, iters, located, coord, subset) -> list[ir.Stmt]:
        inner = st.copy()
        inner.depth += 1
        stmts: list[ir.Stmt] = []
        for n in subset:
            if n not in iters:
                continue  # a guarded operand: located below, or read as dense
            it = iters[n]
            inner.levels[n] += 1
            inner.pos[n] = it.pos
            inner.seg_end[n] = it.seg if not it.unique else None
        for n in located:
            stmts.append(self._locate(n, st, inner))
        kind = self._out_kind(coord.name, st) if st.ws is None else None
        if kind is not None:
            lvl = st.out_level
            inner.out_level += 1
            dim = self.out_params.dims[self.out_fmt.mode_order[lvl]]
            q = Var(f"p{self.out_name}{lvl}", I64)
            last = lvl == self.out_fmt.order - 1
            if kind == "U":
                stmts.append(ir.Decl(q, self.out_fmt.levels[lvl].locate(st.out_pos, coord, dim)))
            elif last and inner.depth < len(inner.order):
                inner.pending = (lvl, coord)
                return stmts + self._at_depth(term, inner)
            else:
                counter = self._counter(st, lvl)
                stmts.append(ir.Decl(q, counter))
                if not self.assembling:
                    stmts.append(
                        ir.Store(self.out_params.levels[lvl]["crd"], q, ir.cast(coord, self.it))
                    )
                stmts.append(ir.Assign(counter, ir.add(counter, Const(1, I64))))
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
    setup: list = field(default_factory=list)  # finds an affine window before the loop
    skip: list = field(default_factory=list)  # steps past coordinates off a stride
    stride: int = 1
    offset: ir.Expr | None = None  # set for an affine index: coordinate = stride*v + offset


def _factors(t: Term) -> list[Term]:
    if isinstance(t, Op) and t.op == "*":
        return _factors(t.left) + _factors(t.right)
    return [t]


def _ast_factors(e) -> list:
    if isinstance(e, ast.Binary) and e.op == "*":
        return _ast_factors(e.left) + _ast_factors(e.right)
    return [e]


def _product(terms: list[Term]) -> Term:
    out = terms[0]
    for t in terms[1:]:
        out = Op("*", out, t)
    return out


def _segment_search(pos: Array, target: ir.Expr, rng: tuple[Var, Var], q: Var) -> list[ir.Stmt]:
    """``q`` = the parent whose segment of ``pos`` holds child position ``target``."""
    lo, hi, mid = Var(f"{q.name}_l", I64), Var(f"{q.name}_h", I64), Var(f"{q.name}_m", I64)
    step = [
        ir.Decl(mid, ir.Bin("/", ir.add(lo, hi), Const(2, I64))),
        ir.If(
            ir.Cmp("<=", ir.cast(ir.Load(pos, mid), I64), target),
            [ir.Assign(lo, mid)],
            [ir.Assign(hi, mid)],
        ),
    ]
    return [
        ir.Decl(lo, rng[0]),
        ir.Decl(hi, rng[1]),
        ir.While(ir.Cmp(">", ir.sub(hi, lo), Const(1, I64)), step),
        ir.Decl(q, lo),
    ]


def _floordiv(a: ir.Expr, d: int) -> ir.Expr:
    """Division rounding down, for a positive constant divisor (LLIR's ``/`` truncates)."""
    if d == 1:
        return a
    k = Const(d, I64)
    rem = ir.Bin("%", ir.add(ir.Bin("%", a, k), k), k)
    return ir.Bin("/", ir.sub(a, rem), k)


def _ceildiv(a: ir.Expr, d: int) -> ir.Expr:
    return a if d == 1 else ir.Neg(_floordiv(ir.Neg(a), d))


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
