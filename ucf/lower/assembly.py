"""The output: dense stores, and appends to a sparse output's levels."""

from __future__ import annotations

from ucf.format.format import Format
from ucf.format.levels import LevelKind
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.lower import product_bound, row_chunks
from ucf.lower.lattice import Term, operands, presence, reduces
from ucf.lower.row_chunks import OnePass
from ucf.lower.state import (
    Operand,
    SlotParams,
    State,
)


class AssemblyMixin:
    """Part of :class:`ucf.lower.lowerer.Lowerer`; see its docstring for the shared state."""

    def _local_level(self) -> int | None:
        """The one compressed output level below only dense ones, if that is the shape.

        Such an output (CSR and its kin) is counted per segment, so each
        segment's positions are known before the compute pass and its dense
        loops can run in parallel.
        """
        if not self.sparse_out:
            return None
        sparse = [k for k, lvl in enumerate(self.out_fmt.levels) if not lvl.full]
        if len(sparse) == 1 and self.out_fmt.levels[sparse[0]].segment_array is not None:
            return sparse[0]
        return None

    def _appends_rows(self) -> bool:
        """Whether the output's entries may be appended row by row as its operands'
        are met (``_bound_operands``, ``_same_structure``): only its last level is
        sparse, nothing is summed, it has no fill and no blocks, and no fused, pos or
        assemble command reshapes the nest."""
        a = self.applied
        return not (
            self.local != self.out_fmt.order - 1
            or self.reduces
            or self.cin.reduction_vars
            or self.out_fmt.fill
            or self.cin.blocks
            or (a is not None and (a.fused or a.pos or a.assemble is not None))
        )

    def _stored_like_output(self, op: Operand) -> bool:
        """Whether operand ``op`` is stored as the output is: dense levels above one
        compressed level, indexed by the output's variables in its level order."""
        levels = op.fmt.levels
        return (
            [ix.single_variable for ix in op.level_idx] == self.out_level_vars
            and all(k.full for k in levels[:-1])
            and levels[-1].segment_array is not None
        )

    def _bound_operands(self) -> list[int]:
        """The operands whose stored entries bound the output's, when a serial kernel may
        append the output in one pass, as scipy adds sparse matrices: a sum or product of
        sparse operands stored like the output (dense levels above one compressed level,
        indexed by the output's variables in its level order), which is zero where they
        all are, so each output entry is an entry of one of them. Where they are absent
        they read as their fills, so the term is folded with those (``A - A`` of an
        operand filled with -inf is NaN there, stored at every position); an output whose
        fill is not 0 stores the zeros too, so no operand bounds it. The arrays are then
        allocated to hold their entries together (``_one_pass``, ``_entries_before``),
        the rows appended one after the other, and trimmed once: no pass counts the
        entries first. Rows built in parallel append in chunks from the bound of the
        rows before them (``ucf.lower.row_chunks``). A precompute's workspaces count
        nothing of their own: what they gather is of the operands' entries (no sum runs),
        and the consumer appends each entry once, as the plain nest does."""
        if not self._appends_rows():
            return []
        if not row_chunks.shares_rows(self.applied, self.out_level_vars, self.out_fmt):
            return []
        found = []
        for n, op in self.operands.items():
            if n >= len(self.rhs_accesses):
                continue  # a workspace, of operands' entries that are counted here
            if not self._stored_like_output(op):
                return []
            found.append(n)
        if not found or presence(self.term, dict.fromkeys(found, False), self._fill) is not False:
            return []
        return found

    def _same_structure(self) -> int | None:
        """The operand whose entries are the output's, position for position, if any:
        the one sparse operand, CSR-like (dense levels above one compressed level)
        and indexed by the output's variables in its level order, as the output is,
        in a statement that is zero wherever it is (``2*A(i,j)``, ``A(i,j)/x(i)``) and
        sums nothing. Each of its positions then appends one output entry in order, so
        the output's segments start where its own do, less its first position: the
        compute pass reads that instead of the positions the assemble pass wrote,
        and its loop over a row carries no counter (``ucf.passes.flat_positions``
        then walks all the positions at once)."""
        if not self._appends_rows() or (self.applied is not None and self.applied.precompute):
            return None
        read = operands(self.term)  # A(i,j)*A(i,j) reads one (``_same_reads``)
        sparse = [n for n, op in self.operands.items() if n in read and not op.dense]
        if len(sparse) != 1 or list(self.cin.order) != self.out_level_vars:
            return None
        op = self.operands[sparse[0]]
        if not self._stored_like_output(op) or op.fmt.fill:
            return None
        if presence(self.term, {sparse[0]: False}, self._fill) is not False:
            return None
        return sparse[0]

    def _first_position(self) -> ir.Expr:
        """Where the positions of the same-structure operand's last level start."""
        op = self.operands[self.same_structure]
        last = len(op.fmt.levels) - 1
        kind, arrays = op.fmt.levels[last], op.params.levels[last]
        return ir.cast(kind.bounds(arrays, Const(0, I64), None, op.dim(last))[0], I64)

    def _one_pass(self) -> OnePass | None:
        """The bound of a one-pass output, if one covers it: the operands' entries
        together for a sum or element-wise product (``_bound_operands``), the count of
        products for a Gustavson product (``ucf.lower.product_bound``)."""
        found = self._bound_operands()
        counts, last = self._counts_array(), self.out_fmt.order - 1
        if found:
            parents: ir.Expr = Const(1, I64)
            for lvl in range(last):
                parents = ir.mul(parents, self._level_dim(lvl))
            total = self._entries_before(found, parents)
            return OnePass(
                "arrays that hold the operands' entries together (no pass counts its "
                "entries first)",
                "Bound the entries of the output: those of the operands together.",
                lambda: [
                    ir.Store(counts, Const(lvl, I64), total if lvl == last else Const(0, I64))
                    for lvl in range(self.out_fmt.order)
                ],
                lambda r: self._entries_before(found, r),
                lambda loop: [],
            )
        pair = product_bound.operands(self)
        if pair is None:
            return None
        a, b = (self.operands[n] for n in pair)
        n_k = self.extents[self.out_level_vars[1]]
        kind, arrays = self.out_fmt.levels[1], self.out_params.levels[1]
        out = (kind, arrays, self.it)
        return OnePass(
            product_bound.NOTE.format(cap=product_bound.CAP),
            "Bound the entries of the output: the products of the operands' entries.",
            lambda: product_bound.assemble(a, b, n_k, counts),
            lambda r: ir.cast(kind.bounds(arrays, r, None, None)[0], I64),
            lambda loop: product_bound.rows(a, b, n_k, out, loop),
            emptied=True,
        )

    def _entries_before(self, found: list[int], parent: ir.Expr) -> ir.Expr:
        """The entries of operands ``found`` in the segments before ``parent`` (of their
        last level, whose parents are the output's): the bound of the output's there."""
        total: ir.Expr = Const(0, I64)
        for n in found:
            op = self.operands[n]
            last = len(op.fmt.levels) - 1
            kind, arrays, dim = op.fmt.levels[last], op.params.levels[last], op.dim(last)
            first = ir.cast(kind.bounds(arrays, Const(0, I64), None, dim)[0], I64)
            end = ir.cast(kind.bounds(arrays, parent, None, dim)[0], I64)
            total = ir.add(total, ir.sub(end, first))
        return total

    def _one_pass_note(self) -> str:
        """What ``k.cin`` says of a one-pass output's arrays (empty: two passes)."""
        if self.one_pass is None:
            return ""
        return self.one_pass.note + (row_chunks.NOTE if self.parallel else "")

    def _chunked(self, body: list[ir.Stmt]) -> list[ir.Stmt]:
        """A one-pass compute body whose rows run in parallel, in chunks that each append
        into their own bounded region (``ucf.lower.row_chunks``)."""
        if self.one_pass is None or self.out_fmt.order != 2:
            return body
        out = (self.out_fmt.levels[1], self.out_params.levels[1], self.it)
        row, vals = self.out_level_vars[0], self.out_params.vals
        return row_chunks.rewrite(body, row, self.counters[1], self.one_pass, out, vals)

    def _out_kind(self, v: str, st: State) -> LevelKind | None:
        """The kind of the output level loop ``v`` places a coordinate in, if any."""
        if not self.sparse_out or st.out_level >= self.out_fmt.order:
            return None
        if self.out_level_vars[st.out_level] != v:
            return None
        return self.out_fmt.levels[st.out_level]

    def _close_segment(self, st: State, end: ir.Expr) -> list[ir.Stmt]:
        """Record where the output segment of the current parent position ends."""
        lvl = st.out_level
        kind = self.out_fmt.levels[lvl]
        return kind.close(self.out_params.levels[lvl], st.out_pos, end, self.it)

    def _accumulate(self, term: Term, st: State) -> list[ir.Stmt]:
        """The rest of the nest summed into a scalar, stored once every output variable is
        bound; for an append deferred past a reduction (``st.pending``), the entry is
        appended only if some term of the reduction was present, so the output's
        pattern is exactly the implied one."""
        factors = self._integer_factors(term, st)
        acc = Var(f"t{next(self._fresh)}", self.vt if factors is None else "i32")
        inner = st.copy()
        inner.acc = acc
        result: ir.Expr = acc
        if factors is not None:
            result = self._integer_sum(acc, factors, inner, st)
        if st.pending is None:
            return [
                ir.Decl(acc, Const(0, acc.type)),
                *self._nest(term, inner),
                self._store_output(st, result),
            ]
        hit = Var(f"{acc.name}_hit", "i1")
        inner.hit = hit
        lvl, coord = st.pending
        q = Var(f"p{self.out_name}{lvl}", I64)
        counter = self._counter(st, lvl)
        insert: list[ir.Stmt] = [ir.Decl(q, counter)]
        if not self.assembling:
            insert += self.out_fmt.levels[lvl].append(
                self.out_params.levels[lvl], q, coord, self.it
            )
            insert.append(ir.Store(self.out_params.vals, q, result))
        insert.append(ir.Assign(counter, ir.add(counter, Const(1, I64))))
        return [
            ir.Decl(acc, Const(0, acc.type)),
            ir.Decl(hit, Const(False, "i1")),
            *self._nest(term, inner),
            ir.If(hit, insert),
        ]

    def _output_level(self, term: Term, st: State, inner: State, coord: Var) -> list[ir.Stmt]:
        """Place the coordinate of loop ``coord`` in the output level it indexes: locate it
        in a dense level, append it to a compressed one, or defer the append (setting
        ``inner.pending``) until the reduction or nested sum below has met an entry."""
        lvl = st.out_level
        inner.out_level += 1
        kind = self.out_fmt.levels[lvl]
        dim = self.out_params.dims[self.out_fmt.mode_order[lvl]]
        q = Var(f"p{self.out_name}{lvl}", I64)
        last = lvl == self.out_fmt.order - 1
        if kind.full:
            inner.out_pos = q
            return [ir.Decl(q, kind.locate(st.out_pos, coord, dim))]
        if last and (inner.depth < len(inner.order) or reduces(term)):
            inner.pending = (lvl, coord)
            return []
        counter = self._counter(st, lvl)
        stmts: list[ir.Stmt] = [ir.Decl(q, counter)]
        if not self.assembling:
            stmts += kind.append(self.out_params.levels[lvl], q, coord, self.it)
        stmts.append(ir.Assign(counter, ir.add(counter, Const(1, I64))))
        inner.out_pos = q
        return stmts

    def _counter(self, st: State, lvl: int) -> Var:
        if lvl == self.local and st.counter is not None:
            return st.counter
        return self.counters[lvl]

    def _store_output(self, st: State, value: ir.Expr) -> ir.Stmt:
        # Each output position is reached exactly once when only output variables
        # enclose the store (lattice loops partition the coordinates), so `=`
        # statements can overwrite instead of read-modify-write.
        outer = st.order[: st.depth]
        once = (
            self.cin.statement.op == "="
            and all(v in self.out_vars for v in outer)
            and not self.repeats
        )
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

    # ------------------------------------------------------- finishing an output
    # A sparse output leaves the generated functions complete, so the exported C
    # and the Python binding share one implementation: the assemble pass turns the
    # per-segment counts of the local level into positions and reports every
    # level's size; the compute pass starts from zeroed segments, fills the
    # segments of parents it never visited, and drops entries whose segments
    # below stayed empty.
    def _level_dim(self, lvl: int) -> ir.Expr:
        """The extent of the output level (a parameter of both passes)."""
        return self.extents[self.out_vars[self.out_fmt.mode_order[lvl]]]

    def _segments(self, lvl: int):
        """The output level's kind and arrays, and a loop over ``q`` in [lo, hi)."""
        kind = self.out_fmt.levels[lvl]
        q = Var(f"q{self.out_name}{lvl}_{next(self._fresh)}", I64)
        return kind, self.out_params.levels[lvl], q

    def _zeroed(self, lvl: int, parents: ir.Expr) -> list[ir.Stmt]:
        """Every segment of level ``lvl`` empty (its arrays come uninitialized)."""
        kind, arrays, q = self._segments(lvl)
        zero = Const(0, I64)
        close = kind.close(arrays, q, zero, self.it)
        return [*kind.close(arrays, Const(-1, I64), zero, self.it), ir.For(q, zero, parents, close)]

    def _assemble_finish(self) -> list[ir.Stmt]:
        """In the assemble pass, after counting: the local level's counts become
        positions (a prefix sum) and its size joins the other levels' counts."""
        if self.local is None:
            return []
        parents: ir.Expr = Const(1, I64)
        for lvl in range(self.local):
            parents = ir.mul(parents, self._level_dim(lvl))
        kind, arrays, q = self._segments(self.local)
        begin, end = kind.bounds(arrays, q, None, self._level_dim(self.local))
        total = ir.add(ir.cast(begin, I64), ir.cast(end, I64))
        count, _ = kind.bounds(arrays, parents, None, self._level_dim(self.local))
        return [
            ir.For(q, Const(0, I64), parents, kind.close(arrays, q, total, self.it)),
            ir.Store(self._counts_array(), Const(self.local, I64), ir.cast(count, I64)),
        ]

    def _assemble_start(self) -> list[ir.Stmt]:
        if self.local is None:
            return []
        parents: ir.Expr = Const(1, I64)
        for lvl in range(self.local):
            parents = ir.mul(parents, self._level_dim(lvl))
        return self._zeroed(self.local, parents)

    def _compute_start(self) -> list[ir.Stmt]:
        """Zero the segments the compute pass appends into (all but the local level's,
        which the assemble pass filled); parent counts come from the counts array."""
        stmts: list[ir.Stmt] = []
        parents: ir.Expr = Const(1, I64)
        for lvl, kind in enumerate(self.out_fmt.levels):
            if self.one_pass and not self.one_pass.emptied and not kind.full:
                # every row closes its segment: start the first
                stmts += kind.close(
                    self.out_params.levels[lvl], Const(-1, I64), Const(0, I64), self.it
                )
            elif not kind.full and lvl != self.local:
                stmts += self._zeroed(lvl, parents)
            parents = (
                ir.mul(parents, self._level_dim(lvl))
                if kind.full
                else ir.Load(self._counts_array(), Const(lvl, I64))
            )
        return stmts

    def _compute_finish(self) -> list[ir.Stmt]:
        """After the compute pass: parents never visited get the segment where the
        previous one ended, then entries with empty segments below are dropped."""
        stmts: list[ir.Stmt] = []
        sizes: list[ir.Expr] = []  # positions of each level
        parents: ir.Expr = Const(1, I64)
        for lvl, kind in enumerate(self.out_fmt.levels):
            if kind.full:
                parents = ir.mul(parents, self._level_dim(lvl))
            else:
                kind, arrays, q = self._segments(lvl)
                dim = self._level_dim(lvl)
                begin, end = kind.bounds(arrays, q, None, dim)
                steady = ir.Select(ir.Cmp("<", end, begin), begin, end)
                # The assemble pass left the local level complete; a one-pass output's rows
                # all closed their segments.
                if lvl != self.local and not self.one_pass:
                    stmts.append(
                        ir.For(q, Const(0, I64), parents, kind.close(arrays, q, steady, self.it))
                    )
                size = Var(f"{self.out_name}{lvl}_final", I64)
                stmts.append(
                    ir.Decl(size, ir.cast(kind.bounds(arrays, parents, None, dim)[0], I64))
                )
                parents = size
            sizes.append(parents)
        for lvl in range(self.out_fmt.order - 2, -1, -1):
            kind, child = self.out_fmt.levels[lvl], self.out_fmt.levels[lvl + 1]
            if kind.full or child.full:
                continue
            above = sizes[lvl - 1] if lvl else Const(1, I64)
            stmts += self._drop_empty(lvl, sizes[lvl], above)
        return stmts

    def _drop_empty(self, lvl: int, count: ir.Expr, parents: ir.Expr) -> list[ir.Stmt]:
        """Remove the entries of level ``lvl`` whose segment in level ``lvl + 1`` is
        empty, in place (entries only move down), renumbering the segments of
        level ``lvl`` that point at them."""
        kind, arrays, q = self._segments(lvl)
        child, below = self.out_fmt.levels[lvl + 1], self.out_params.levels[lvl + 1]
        dim, child_dim = self._level_dim(lvl), self._level_dim(lvl + 1)
        tag = f"{self.out_name}{lvl}_{next(self._fresh)}"
        kept, start, r = (Var(f"{n}{tag}", I64) for n in ("kept", "start", "r"))
        end = Var(f"end{tag}", I64)
        # r walks the segment boundaries of level lvl; one at q is renumbered to kept
        # (the load is clamped: a non-short-circuit `and` must not read past the end)
        boundary = ir.cast(kind.bounds(arrays, ir.minimum(r, parents), None, dim)[0], I64)
        renumber = ir.While(
            ir.land(ir.Cmp("<=", r, parents), ir.Cmp("==", boundary, q)),
            [
                *kind.close(arrays, ir.sub(r, Const(1, I64)), kept, self.it),
                ir.Assign(r, ir.add(r, Const(1, I64))),
            ],
        )
        move = [
            *kind.append(arrays, kept, kind.coordinate(arrays, q), self.it),
            *child.close(below, kept, end, self.it),
            ir.Assign(kept, ir.add(kept, Const(1, I64))),
        ]
        body = [
            renumber,
            ir.Decl(end, ir.cast(child.bounds(below, q, None, child_dim)[1], I64)),
            ir.If(ir.Cmp(">", end, start), move),
            ir.Assign(start, end),
        ]
        return [
            ir.Decl(kept, Const(0, I64)),
            ir.Decl(start, Const(0, I64)),
            ir.Decl(r, Const(0, I64)),
            ir.For(q, Const(0, I64), count, body),
            ir.While(
                ir.Cmp("<=", r, parents),
                [
                    *kind.close(arrays, ir.sub(r, Const(1, I64)), kept, self.it),
                    ir.Assign(r, ir.add(r, Const(1, I64))),
                ],
            ),
        ]
