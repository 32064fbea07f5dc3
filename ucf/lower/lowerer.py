"""Lower a CIN to LLIR functions: the driver of the recursion down the loop order.

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

The recursion is split by what each step handles, one mixin per module:

- ``abi``: the kernel's parameters;
- ``iterators``: walking one operand's levels;
- ``windows``: affine indices (windows over compressed levels, guards on dense ones);
- ``coiterate``: the loop over one index variable, its merge cases and flat co-iteration;
- ``blocks``: coordinate-space splits of co-iterated loops;
- ``assembly``: the output, dense or appended;
- ``temporaries``: nested sums computed where their variables are fixed;
- ``placement``: where each ``precompute`` goes;
- ``workspaces``: the wheres of ``precompute``;
- ``fused``: ``pos`` over fused levels;
- ``held``: stored values widened to numbers, and sums of quantized products;
- ``leaf_values``: the right-hand side's value at the innermost loop.

They share the state set up in :meth:`Lowerer.__init__` (``cin``, ``operands``,
``extents``, the output's parameters, the schedule) and the per-walk
:class:`ucf.lower.state.State`. What it refuses before building anything is checked
in ``supported``.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from ucf.cin.notation import CIN
from ucf.errors import ScheduleError
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Array, Const, Var
from ucf.lang.ast import accesses
from ucf.lang.reductions import peel, temporary
from ucf.lower import row_chunks, sort, transforms
from ucf.lower.abi import ParamsMixin
from ucf.lower.assembly import AssemblyMixin
from ucf.lower.coiterate import CoiterationMixin, TooManyCases
from ucf.lower.coordinate_split import BlocksMixin
from ucf.lower.fused import FusedMixin
from ucf.lower.held import HeldMixin
from ucf.lower.iterators import IteratorsMixin
from ucf.lower.lattice import (
    Lit,
    Negate,
    Op,
    Opnd,
    Term,
    from_ast,
    reduces,
    shared_reads,
    top_reduces,
)
from ucf.lower.leaf_values import LeafValuesMixin
from ucf.lower.nest import Nest
from ucf.lower.parallel import mark_independent
from ucf.lower.placement import PlacementMixin
from ucf.lower.state import Lowered, Operand, SlotParams, State
from ucf.lower.supported import check_supported
from ucf.lower.temporaries import TemporariesMixin
from ucf.lower.windows import WindowsMixin
from ucf.lower.workspaces import WorkspacesMixin
from ucf.lower.zeroing import zero_slices
from ucf.schedule import Applied, Provenance
from ucf.schedule.commands import SplitCommand


class Lowerer(
    ParamsMixin,
    IteratorsMixin,
    WindowsMixin,
    CoiterationMixin,
    BlocksMixin,
    AssemblyMixin,
    TemporariesMixin,
    PlacementMixin,
    WorkspacesMixin,
    FusedMixin,
    HeldMixin,
    LeafValuesMixin,
):
    """Lowers one CIN; ``lower()`` returns the kernel functions."""

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
        self.term = from_ast(peel(stmt.rhs)[1])
        self.reduces = {r.id: r for r in reduces(self.term)}
        self.distributed: set[int] = set()  # the sums placement.py distributes over terms
        self.temps = {k: Var(temporary(r.vars, r.op), value_type) for k, r in self.reduces.items()}
        self.rhs_accesses = accesses(stmt.rhs)
        self.applied = applied
        check_supported(cin, self.term, value_type, applied)
        fixed = cin.fixed
        self.extents: dict[str, ir.Expr] = {
            v: Const(fixed[v], I64) if v in fixed else Var(f"n_{v}", I64) for v in cin.order
        }
        self.outer_order = tuple(v for v in cin.order if v not in cin.nested_vars)
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
                    slot.name, slot.format, len(a.indices), fixed=self._fixed_modes(a)
                )
            seen[a.tensor] = seen.get(a.tensor, 0) + 1
            label = a.tensor if counts[a.tensor] == 1 else f"{a.tensor}{seen[a.tensor]}"
            idx = [a.indices[m] for m in slot.format.mode_order]
            lv = [ix.base(position) for ix in idx]
            self.operands[n] = Operand(n, label, slot.format, lv, self.slot_params[slot.name], idx)
        self.term = shared_reads(self.term, self._same_reads())
        self.out_fmt = cin.output_format
        out = stmt.lhs
        self.out_name = out.tensor
        self.out_vars = [i.single_variable for i in out.indices]
        self.out_level_vars = [out.indices[m].single_variable for m in self.out_fmt.mode_order]
        self.sparse_out = not self.out_fmt.is_dense
        self.out_params = self._slot_params(
            out.tensor, self.out_fmt, len(out.indices), output=True, fixed=self._fixed_modes(out)
        )
        self.counters = [Var(f"{out.tensor}{lvl}_size", I64) for lvl in range(self.out_fmt.order)]
        sparse_levels = [k for k, lvl in enumerate(self.out_fmt.levels) if not lvl.full]
        self.last_appended = max(sparse_levels, default=-1)
        # A dense loop over a block's places stops at the variable's true extent where
        # the statement could be non-zero in the padding of a last, partial block (the
        # blocked variable's own extent is a parameter for that); elsewhere it keeps the
        # block's constant size, and padded output entries are cut away after the call.
        self.loop_ends: dict[str, ir.Expr] = {}
        for inner, (v, outer, b) in cin.blocks.items():
            if cin.order.index(inner) < cin.order.index(outer):
                raise ScheduleError(
                    f"loop order {', '.join(cin.order)}: {inner} (the place in a block of {v}) "
                    f"runs outside {outer} (the block); a block's places must be inside it"
                )
            self.extents[v] = Var(f"n_{v}", I64)
            if inner in self.out_vars or self._padding_vanishes(inner):
                continue
            start = ir.mul(Var(outer, I64), Const(b, I64))
            self.loop_ends[inner] = ir.minimum(Const(b, I64), ir.sub(self.extents[v], start))
        self.assembling = False
        self._fresh = itertools.count()
        self.applied = applied
        self.pos_map = applied.pos if applied else {}
        self.fused = {f[0][0]: f for f in applied.fused} if applied else {}
        self.steps = list(applied.steps) if applied else []
        # A split of an original variable, in case its loop co-iterates (see _blocks).
        self.splits = {c.var: c for c in self.steps if isinstance(c, SplitCommand)}
        self.parallel = applied.parallel if applied else {}
        self.consumed: set = set()  # steps this pass built itself; transforms skip them
        self.entries: dict[str, tuple[Var, int]] = {}
        # Set when a fused pos loop walks a non-unique level: its coordinates repeat.
        self.repeats = False
        self.workspaces: list[tuple[Array, ir.Expr]] = []  # allocated arrays, lengths
        self.local = self._local_level()
        self.same_structure = self._same_structure()  # see there
        # the output in one pass (see there), where it is not the operand's structure
        self.one_pass = None if self.same_structure is not None else self._one_pass()
        if self.one_pass:
            self.local = None
            if applied is not None and applied.parallel and self.out_fmt.order == 2:
                # rows in chunks of their own (``_chunked``), shared out unsplit
                self.steps, self.parallel = row_chunks.unsplit(applied, self.out_level_vars[0])
                self.splits = {c.var: c for c in self.steps if isinstance(c, SplitCommand)}
        self.use_acc = not (applied and self._interleaved(applied)) or self.sparse_out
        self.wheres = self._plan_wheres() if applied and applied.precompute else []
        # The sums of integer products: each one's factors and the extents it runs over.
        self.integer_sums: list[tuple[tuple[str, ...], tuple]] = []
        self.rescaled: dict[int, ir.Expr] = {}  # a nested int32 sum's value, rescaled

    def _same_reads(self) -> dict[int, int]:
        """Each access that reads what an earlier one reads, the same storage at the
        same plain variables level by level (``A(i,j)*A(i,j)``), mapped to the earlier
        one: they walk the same positions, so one iterator serves both, where two would
        merge a row with itself. Only outside nested sums (whose terms are kept apart),
        over unique levels (a merge of repeated coordinates pairs them up), and for a
        tensor read as 0 where absent: with ``fill=-inf``, ``A - A + B`` where A is
        absent is NaN through two reads (IEEE's -inf - -inf, which the filled-operand
        test in tests/toolchain/test_asan.py holds), and one walk folded it to -inf by
        the structural rule of docs/language.md; so a shared walk would change answers
        there, and such a tensor keeps its two reads."""
        if self.reduces or (self.applied is not None and self.applied.precompute):
            return {}
        first: dict[tuple, int] = {}
        alias: dict[int, int] = {}
        for n, op in self.operands.items():
            if any(ix.single_variable is None for ix in op.level_idx):
                continue
            if not all(op.fmt.unique(lvl) for lvl in range(op.fmt.order)) or self._fill(n):
                continue
            key = (self.cin.slots[n].name, tuple(ix.single_variable for ix in op.level_idx))
            if key in first:
                alias[n] = first[key]
            else:
                first[key] = n
        return alias

    def _padding_vanishes(self, v: str) -> bool:
        """Whether the statement is zero wherever ``v`` is in a block's padding: it is a
        product of accesses and literals, one of them indexed by ``v`` (every split
        tensor is zero in its padding, and no factor can be infinite there). A factor
        whose absent entries read as a non-zero fill (``fill=-inf``) is not zero in the
        padding, and a zero times an infinite fill is NaN, so its loops stop at the extent."""
        if self.reduces:
            return False

        def factors(t: Term) -> list[Term]:
            if isinstance(t, Op) and t.op == "*":
                return factors(t.left) + factors(t.right)
            return factors(t.operand) if isinstance(t, Negate) else [t]

        found = factors(self.term)
        if not all(isinstance(f, Opnd | Lit) for f in found):
            return False
        indexed = [f for f in found if isinstance(f, Opnd)]
        if any(self.operands[f.n].fmt.fill for f in indexed):
            return False
        return any(v in i.variables for f in indexed for i in self.rhs_accesses[f.n].indices)

    def _loop_end(self, v: str) -> ir.Expr:
        """Where a dense loop over ``v`` ends."""
        return self.loop_ends.get(v, self.extents[v])

    def _fixed_modes(self, a) -> tuple[int, ...]:
        """Each mode's size when an index variable of fixed extent indexes it alone, else 0."""
        fixed = self.cin.fixed
        return tuple(fixed.get(idx.single_variable, 0) for idx in a.indices)

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

    # ------------------------------------------------------------------ entry
    def lower(self) -> Lowered:
        """The kernel's functions; built again with one body per merge (``one_body``)
        when a pass's case chains grow past ``CASES`` copies of the loops below them
        (both passes alike: the assemble pass counts the entries the compute pass
        writes)."""
        sums = len(self.integer_sums)
        try:
            return self._lower()
        except TooManyCases:
            self.assembling = False
            del self.integer_sums[sums:]
            self.entries.clear()
            self.one_body = True
            self.cin.notes.append(
                f"co-iteration: the merges' cases would copy the loops below them more than "
                f"{self.CASES} times, so each merge takes one body with match flags"
            )
            return self._lower()

    def _lower(self) -> Lowered:
        assemble = None
        if self.one_pass:
            assemble = ir.Function(
                f"{self.name}_assemble",
                self._params(True),
                self.one_pass.assemble(),
                doc=self.one_pass.doc,
            )
        elif self.sparse_out:
            self.assembling = True
            # The assemble pass has no output storage; its dense levels' sizes are extents.
            dims = zip(self.out_params.dims, self.out_vars, strict=True)
            body = [ir.Decl(d, self.extents[v]) for d, v in dims if isinstance(d, Var)]
            body += self._function_body()
            body += [
                ir.Store(self._counts_array(), Const(lvl, I64), c)
                for lvl, c in enumerate(self.counters)
            ]
            assemble = ir.Function(
                f"{self.name}_assemble",
                self._params(True),
                self._assemble_start() + self._scheduled(body) + self._assemble_finish(),
                doc="Count the entries of each output level.",
            )
            self.assembling = False
        body = self._scheduled(self._function_body())
        body = self._chunked(body)
        if self.sparse_out:
            body = self._compute_start() + body + self._compute_finish()
        compute = ir.Function(
            self.name, self._params(False), body, doc=f"Compute {self.cin.statement}."
        )
        sorts = any(wh.ws.sort_tmp for wh in self.wheres)
        helpers = [sort.sort_function()] if sorts else []
        one_pass = self._one_pass_note()
        same = "" if self.same_structure is None else self.cin.slots[self.same_structure].name
        return Lowered(compute, assemble, helpers, self.local, self.integer_sums, one_pass, same)

    def zeroed(self, compute: ir.Function) -> tuple[ir.Function, tuple[str, ...]]:
        """The compute function zeroing its dense output itself, a slice at a time
        (``ucf.lower.zeroing``), where its loops allow, and the variables that fix a
        slice (``()``: the caller zeroes). For the CPU targets, on the final loops: after
        ``dismantle``, which may unroll a loop over an output variable, and after the
        passes that tile the nests, which look for the loops as the lowerer built them."""
        if self.sparse_out or self.cin.statement.op != "=" or self.wheres or self.repeats:
            return compute, ()
        full = {v for v, whole in self.whole_loops.items() if whole and v in self.out_vars}
        dims = [self.out_params.dims[m] for m in self.out_fmt.mode_order]
        provenance = self.applied.provenance if self.applied else None
        fixed = zero_slices(
            compute.body, full, provenance, self.out_level_vars, self.out_params.vals, dims
        )
        if not fixed:
            return compute, ()
        doc = f"{compute.doc} It writes every element of {self.out_name}, which need not be zeroed."
        return replace(compute, doc=doc), fixed

    def _scheduled(self, body: list[ir.Stmt]) -> list[ir.Stmt]:
        """Apply the loop transformations of the schedule to a built nest."""
        if self.applied is None:
            mark_independent(self._loop_nest(body, Provenance([])))
            return body
        for ws, size in self.workspaces:
            body.insert(0, ir.Alloc(ws, size))
            body.append(ir.Free(ws))
        nest = self._loop_nest(body, self.applied.provenance)
        steps, parallel = self.steps, self.parallel
        if self.assembling and self.applied.query is not None:
            steps, parallel = self.applied.query
        steps = [c for c in steps if c not in self.consumed]
        transforms.apply(nest, steps, parallel)
        self.entries.clear()
        return nest.body

    def _loop_nest(self, body: list[ir.Stmt], provenance: Provenance) -> Nest:
        """``body`` with what the loop transformations need to know of it."""
        parallel_out: set[str] = set()
        chunked: frozenset[str] = frozenset()
        if self.local is not None:
            parallel_out = set(self.out_level_vars[: self.local])
        elif self.one_pass and self.out_fmt.order == 2:
            # its rows run in chunks, each appending into a region of its own (``_chunked``)
            parallel_out, chunked = {self.out_level_vars[0]}, frozenset({self.counters[1].name})
        return Nest(
            body,
            provenance,
            set(self.out_vars),
            self.out_params.vals.name,
            self.sparse_out,
            parallel_out,
            entries=dict(self.entries),
            workspaces=[ws for ws, _ in self.workspaces],
            filled={
                wh.ws.vals.name: frozenset((wh.ws.var, *wh.ws.more))
                for wh in self.wheres
                if wh.ws.list is None
            },
            partial=self.assembling,
            trailing_out=set(self.out_level_vars[self.last_appended + 1 :]),
            chunked=chunked,
        )

    def _function_body(self) -> list[ir.Stmt]:
        self.cases_built = 0
        body: list[ir.Stmt] = (
            [ir.Decl(c, Const(0, I64)) for c in self.counters] if self.sparse_out else []
        )
        self.consumed = set()
        self.whole_loops: dict[str, bool] = {}  # loop label -> visits every coordinate
        state = State(order=self.outer_order, target=self.out_fmt.fill)
        for n in self.operands:
            state.levels[n] = 0
            state.pos[n] = Const(0, I64)
        self.workspaces = []
        for wh in self.wheres:
            self.workspaces += wh.ws.allocations(self.assembling)
        body += self._at_depth(self.term, state)
        return body

    # --------------------------------------------------------------- descent
    def _at_depth(self, term: Term, st: State) -> list[ir.Stmt]:
        order = st.order
        d = st.depth
        here = st.scope[-1] if st.scope else None
        for wh in self.wheres:
            if wh.parent == here and wh.depth == d:
                return self._where(wh, st)
        remaining = order[d:]
        out_vars = [st.ws.var, *st.ws.more] if st.ws else self.out_vars
        out_bound = all(v in order[:d] for v in out_vars)
        listing = st.ws is not None and st.ws.list is not None
        if self.assembling and st.pending is None and not listing and not st.temp:
            # Counting is done once every output coordinate that gets appended is placed.
            if out_bound or (st.ws is None and st.out_level > self.last_appended):
                return []
        use_acc = self.use_acc and st.ws is None
        if out_bound and st.acc is None and use_acc and (remaining or st.pending is not None):
            return self._accumulate(term, st)
        return self._nest(term, st)

    def _nest(self, term: Term, st: State) -> list[ir.Stmt]:
        """The loops left at this depth, after any nested sum that can be computed here."""
        bound = set(st.order[: st.depth])
        ready = [r for r in top_reduces(term) if self._free(r) <= bound]
        if ready:
            return self._temporaries(term, st, ready)
        if st.depth == len(st.order):
            return self._leaf(term, st)
        return self._loop(term, st)

    def _leaf(self, term: Term, st: State) -> list[ir.Stmt]:
        if st.ws is not None:
            return self._ws_leaf(term, st)
        seen = [] if st.visits is None else [ir.Assign(st.visits, ir.add(st.visits, Const(1, I64)))]
        if st.hit is not None and self.assembling:
            return [ir.Assign(st.hit, Const(True, "i1")), *seen]
        value = self._value(term, st)
        if st.acc is not None:
            flag = [ir.Assign(st.hit, Const(True, "i1"))] if st.hit is not None else []
            flag += seen
            if st.acc_op == "sum":
                return [ir.Assign(st.acc, ir.add(st.acc, value)), *flag]
            # The new value first: a NaN value keeps the accumulator (ir.Bin's max takes
            # the second operand when a comparison involves NaN), as numpy's nanmax does.
            return [ir.Assign(st.acc, ir.Bin(st.acc_op, value, st.acc)), *flag]
        return [self._store_output(st, value)]
