"""One loop per index variable: merge lattices, cases, flat co-iteration."""

from __future__ import annotations

import itertools

from ucf.errors import ScheduleError, UnsupportedError
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.lower.lattice import (
    Term,
    lattice,
    operands,
    presence,
    restrict,
    why_full,
)
from ucf.lower.state import (
    State,
)


class CoiterationMixin:
    """Part of :class:`ucf.lower.lowerer.Lowerer`; see its docstring for the shared state."""

    #: Co-iterating this many sparse operands or more takes one loop with match flags:
    #: a lattice of n operands has up to 2**n points and 3**n cases, nested per level.
    FLAT = 3
    #: The case bodies (each a copy of the loops below its merge) one lowering builds
    #: before it starts again with ``one_body``. A chain copies the nest below it once
    #: per case, so nested merges multiply: a sum of four operands, two read with a
    #: repeated variable (located and guarded at every level of blocked formats), built
    #: 1,713 (fills fuzz seed 120 case 279: 90k lines of LLVM IR, gcc 3 minutes on the
    #: C). The common kernels build at most 25; about 2 % of the fuzzers' statements
    #: more than 64 (bench/README.md, "Case chains").
    CASES = 64
    #: Set once the chains outgrow ``CASES``: every merge takes one body with match
    #: flags (``_one_body``), guarded operands included.
    one_body = False
    cases_built = 0

    def _loop(self, term: Term, st: State) -> list[ir.Stmt]:
        v = st.order[st.depth]
        if v in self.fused and st.ws is None:
            return self._fused_loop(term, st, *self.fused[v])
        sparse, located = self._sparse_here(v, st)
        used = operands(term)
        present = [n for n in sparse if n in used]
        guards = self._guards(v, st, used, located)
        points = lattice(term, lambda n: n in present or n in guards, self._fill, st.target)
        top = points[0]
        stmts: list[ir.Stmt] = []
        out_kind = self._out_kind(v, st)
        local = out_kind is not None and st.out_level == self.local and st.ws is None
        prefix: list[ir.Stmt] = []
        if local:
            st = st.copy()
            st.counter = Var(f"{self.out_name}{self.local}_at", I64)
            arrays = self.out_params.levels[self.local]
            dim = self.out_params.dims[self.out_fmt.mode_order[self.local]]
            begin = out_kind.bounds(arrays, st.out_pos, None, dim)[0]
            start = Const(0, I64) if self.assembling else ir.cast(begin, I64)
            prefix = [ir.Decl(st.counter, start)]
        st, slide = self._cursors(v, st, used)
        prefix += slide
        iters = {n: self._iterator(n, v, st) for n in present}
        if local and not self.assembling and self.same_structure in iters:
            # the output's entries are the operand's, position for position: its
            # segment starts where the operand's does, less the operand's first position
            it = iters[self.same_structure]
            prefix[0] = ir.Decl(st.counter, ir.sub(it.begin, self._first_position()))
        coord = Var(v, I64)
        label = self._label(v, st)
        # A point that only guarded operands make up needs every coordinate visited.
        guard_only = any(p.iters and not p.iters & set(iters) for p in points)
        full = top.full or (guard_only and bool(iters))
        drives = len(iters) == 1 and not full and next(iter(iters.values())).unique
        if not drives:
            self._require_ordered(v, iters, st)
        self._check_pos(v, st, term, iters, full, drives)
        live = set(iters) | set(guards)
        split = None
        if v in self.splits and iters and not (full or drives or st.ws is not None):
            split = self._narrow_to_blocks(v, iters)
            label = split[-1].inner
        if st.ws is None and not self.assembling:
            whole = full and split is None and self._loop_end(v) is self.extents[v]
            self.whole_loops[label] = self.whole_loops.get(label, True) and whole
        if self._flat(v, iters, guards, st):
            stmts += self._flat_loop(term, st, iters, located, coord, label, full, guards)
        elif drives:
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
            stmts.append(ir.For(coord, Const(0, I64), self._loop_end(v), body, label=label))
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
        if split is not None:
            stmts = self._blocks(split, stmts)
        if local:
            if self.assembling:
                stmts += self._close_segment(st, st.counter)
            return prefix + stmts
        appended = out_kind is not None and out_kind.output == "append"
        if appended and not self.assembling and st.ws is None:
            stmts += self._close_segment(st, self.counters[st.out_level])
        return prefix + stmts

    def _require_ordered(self, v: str, iters: dict, st: State) -> None:
        """Merging or matching coordinates needs them in order; an unordered level can only
        drive its loop alone, with every other operand located."""
        for n, it in iters.items():
            if not it.kind.ordered:
                op = self.operands[n]
                tensor = self.cin.slots[n].tensor if n in self.cin.slots else op.name
                raise UnsupportedError(
                    f"tensor {tensor}, level {st.levels[n]} ({it.kind.name}) "
                    f"stores its coordinates unordered, so the loop over {v} cannot co-iterate "
                    "it with other operands or visit every coordinate; it can only drive the "
                    "loop alone while the other operands are dense there"
                )

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
        # The assemble pass counts alike in every case: one body and branch-free advances
        # (``_one_case``) run without a mispredicted branch per entry.
        two = len(its) == 2 and not flags and live == set(key) and not absent
        if two and not self.assembling:
            body += self._merge_two(term, st, iters, located, coord, its)
            return [ir.While(cond, body, label=label)]
        body += flags.values()
        matches: dict[int, ir.Expr] = {n: f.var for n, f in flags.items()}
        for it in its:
            m = Var(f"{it.coord.name}_hit", "i1")
            body.append(ir.Decl(m, ir.Cmp("==", it.coord, coord)))
            matches[it.n] = m
        cases = self._cases(term, st, iters, located, coord, live, matches, False, absent)
        body += _one_case(cases, [matches[it.n] for it in its])
        for it in its:
            step = [ir.Assign(it.pos, self._advance(it)), *it.skip]
            body += step if len(its) == 1 else [ir.If(matches[it.n], step)]
        return [ir.While(cond, body, label=label)]

    def _merge_two(self, term, st, iters, located, coord, its) -> list[ir.Stmt]:
        """The body of a merge of two iterators, as a three-way branch on their
        coordinates, each way advancing the iterators it matched: the advances then
        depend on a predicted branch, not on the coordinates just loaded, so the next
        iteration's loads need not wait for this one's compare (with the advances
        after a chain of cases, LLVM made them branch-free: a chain from each load to
        the next, 7 % of a sparse add)."""
        a, b = its
        every = set(iters)  # those outside the two (ended) read as absent too

        def way(subset: list[int]) -> list[ir.Stmt]:
            gone = every - set(subset)
            sub = restrict(term, gone, self._fill, st.target)
            stmts = (
                [] if sub is None else self._case_body(sub, st, iters, located, coord, subset, gone)
            )
            for it in (a, b):
                if it.n in subset:
                    stmts += [ir.Assign(it.pos, self._advance(it)), *it.skip]
            return stmts

        below = ir.If(ir.Cmp("<", a.coord, b.coord), way([a.n]), way([b.n]))
        return [ir.If(ir.Cmp("==", a.coord, b.coord), way([a.n, b.n]), [below])]

    def _cases(
        self, term, st, iters, located, coord, live: set[int], matches, full: bool, absent=()
    ):
        """One branch per set of matching iterators and guards, largest set first.

        Iterators and guarded operands outside the matching set, and those in
        ``absent``, read as zero in a branch.
        """
        if self._flat_cases(st):
            return self._one_body(term, st, iters, located, coord, live, matches, absent)
        all_here = set(iters) | live | set(absent)
        # (matching set, absent set, restricted term, the match flags the branch tests)
        cases: list[tuple[tuple[int, ...], set[int], Term | None, frozenset[int]]] = []
        for size in range(len(live), -1, -1):
            if size == 0 and not full:
                break
            for subset in itertools.combinations(sorted(live), size):
                gone = all_here - set(subset)
                tested = frozenset(n for n in subset if n in matches)
                cases.append((subset, gone, restrict(term, gone, self._fill, st.target), tested))
        chain: list[tuple[ir.Expr, list[ir.Stmt]]] = []
        for k, (subset, gone, sub, tested) in enumerate(cases):
            if sub is None:
                # A case that does nothing still claims its matches when a later case
                # tests fewer of them: dropped, its coordinates would fall through to
                # that case and read present operands as absent (fills +inf and -inf
                # disagree about A + B + C where only C is absent).
                if not any(t <= tested for *_, s, t in cases[k + 1 :] if s is not None):
                    continue
                body: list[ir.Stmt] = []
            else:
                self._count_case()
                body = self._case_body(sub, st, iters, located, coord, subset, gone)
            cond: ir.Expr = Const(True, "i1")
            for n in subset:
                if n in tested:
                    cond = ir.land(cond, matches[n])
            chain.append((cond, body))
        stmts: list[ir.Stmt] = []
        for cond, body in reversed(chain):
            if isinstance(cond, Const) and cond.value is True:
                stmts = body
            else:
                stmts = [ir.If(cond, body, stmts)]
        return stmts

    def _count_case(self) -> None:
        self.cases_built += 1
        if self.cases_built > self.CASES and not self.one_body:
            raise TooManyCases

    def _one_body(
        self, term, st, iters, located, coord, live: set[int], matches, absent=()
    ) -> list[ir.Stmt]:
        """``_cases`` as one body, entered where the term is present for the match flags:
        each operand in ``live`` reads as absent (its fill) below where its flag is false,
        and those in ``absent`` everywhere. The code then grows with the operands and
        the loops, not with the cases' product over nested loops (``CASES``). An
        iterator that is not ``live`` has ended (a point loop's tail, past a non-unique
        level's merge) and reads as absent too, as in ``_cases``: its position is stale."""
        gone = set(absent) | (set(iters) - live)
        sub = restrict(term, gone, self._fill, st.target) if gone else term
        if sub is None:
            return []
        flags = {n: matches[n] for n in live if n in matches}
        alive = {}
        for n, flag in flags.items():
            outer = st.alive.get(n)  # a guarded operand's flag says nothing of the levels above
            alive[n] = flag if n in iters or outer is None else ir.land(outer, flag)
        if self.one_body:
            # An operand that did not match above is absent here too: without its flag
            # the body would also run where it alone is present, and write its fill into
            # a sparse output's pattern where the chains write nothing.
            flags = {n: st.alive[n] for n in operands(sub) if n in st.alive} | alive
        present = presence(sub, flags, self._fill, st.target)
        if present is False:
            return []
        self._count_case()
        body = self._case_body(sub, st, iters, located, coord, sorted(live), gone, alive)
        return body if present is True else [ir.If(present, body)]

    def _case_body(
        self, term, st, iters, located, coord, subset, gone=frozenset(), alive: dict | None = None
    ) -> list[ir.Stmt]:
        """Descend past this loop with the operands in ``subset`` matched and those in
        ``gone`` absent; ``alive`` (a flat loop) gives each one a flag instead, for
        whether it matched."""
        inner = st.copy()
        inner.depth += 1
        inner.absent = st.absent | frozenset(gone)
        stmts: list[ir.Stmt] = []
        for n in subset:
            if alive is not None and n in alive:
                inner.alive[n] = alive[n]
            if n not in iters:
                continue  # a guarded operand: located below, or read as dense
            it = iters[n]
            inner.at[n, inner.levels[n]] = it.pos
            inner.levels[n] += 1
            inner.pos[n] = it.pos
            inner.seg_end[n] = it.seg if not it.unique else None
        for n in located:
            stmts.append(self._locate(n, st, inner))
        if st.ws is None and self._out_kind(coord.name, st) is not None:
            stmts += self._output_level(term, st, inner, coord)
        return stmts + self._at_depth(term, inner)

    def _label(self, v: str, st: State) -> str:
        for k, _ in reversed(st.scope):
            if v == self.wheres[k].ws.var:
                return self.wheres[k].label
        if v in self.pos_map:
            return self.pos_map[v][0]
        return v

    def _check_pos(
        self, v: str, st: State, term: Term, iters: dict, full: bool, drives: bool
    ) -> None:
        if v not in self.pos_map:
            return
        vpos, tensor = self.pos_map[v]
        cmd = f"pos({v}, {vpos}, {tensor})"
        names = [self.cin.slots[n].tensor if n in self.cin.slots else "" for n in iters]
        if full:
            why = why_full(term, self._fill, st.target)
            if st.scope and st.scope[-1][1] == "cons":
                ws = self.wheres[st.scope[-1][0]].ws
                why = f"the precompute's consumer walks the dense workspace {ws.name}"
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

    def _flat(self, v: str, iters: dict, guards: dict, st: State) -> bool:
        return (
            len(iters) >= (2 if self._flat_cases(st) else self.FLAT)
            and (not guards or self._flat_cases(st))
            and st.ws is None
            and v not in self.pos_map
            and all(it.unique and it.stride == 1 for it in iters.values())
        )

    def _flat_cases(self, st: State) -> bool:
        """Whether this loop's cases take one body (``one_body``); a precompute's
        workspace keeps its chain."""
        return self.one_body and st.ws is None

    def _flat_loop(self, term, st, iters, located, coord, label, full, guards) -> list[ir.Stmt]:
        """One loop over the union of the iterators' coordinates, whatever the lattice.

        Each iteration finds which iterators match the coordinate and enters the
        body when the expression is structurally present for those matches.  The
        body is the same for every combination: an operand that did not match
        reads as 0 below (its deeper ranges are empty and its values masked), which
        is exactly the restricted expression a lattice case would have built.  So
        the code grows linearly with the operands instead of exponentially.
        """
        stmts: list[ir.Stmt] = []
        for it in iters.values():
            stmts += it.init
        live = {n: ir.Cmp("<", it.pos, it.end) for n, it in iters.items()}
        flags = self._guard_flags(guards, guards)
        body: list[ir.Stmt] = []
        matches: dict[int, ir.Expr] = {n: f.var for n, f in flags.items()}
        if not full:
            beyond = Const(2**62, I64)
            for n, it in iters.items():
                body.append(ir.Decl(it.coord, ir.Select(live[n], self._it_coord(it), beyond)))
            nearest: ir.Expr = iters[min(iters)].coord
            for n in sorted(iters)[1:]:
                nearest = ir.minimum(nearest, iters[n].coord)
            body.append(ir.Decl(coord, nearest))
        body += flags.values()  # a guard reads the coordinate, declared above when not full
        for n, it in iters.items():
            m = Var(f"{it.coord.name}_hit", "i1")
            if full:
                ok = ir.land(live[n], ir.Cmp("==", self._it_coord(it), coord))
            else:
                ok = ir.Cmp("==", it.coord, coord)
            body.append(ir.Decl(m, ok))
            matches[n] = m
        body += self._one_body(term, st, iters, located, coord, set(matches), matches)
        for n, it in iters.items():
            body.append(ir.If(matches[n], [ir.Assign(it.pos, ir.add(it.pos, Const(1, I64)))]))
        if full:
            return [
                *stmts,
                ir.For(coord, Const(0, I64), self._loop_end(coord.name), body, label=label),
            ]
        live_term = presence(term, live, self._fill, st.target)
        return [*stmts, ir.While(live_term, body, label=label)]


class TooManyCases(Exception):
    """The case chains outgrew ``CoiterationMixin.CASES``: lower again with one body."""


def _one_case(cases: list[ir.Stmt], drivers: list[ir.Expr]) -> list[ir.Stmt]:
    """``cases`` as one unconditional body when every branch does the same thing and
    some branch always runs: inside a merge of the iterators whose match flags are
    ``drivers``, one of them always matches (the coordinate is their minimum), so a
    chain whose single-iterator branches cover them all is exhaustive. A sparse add's
    query pass counts an entry alike in each branch; without the branches its merge
    runs without a mispredicted jump per entry."""
    branches: list[tuple[ir.Expr, list[ir.Stmt]]] = []
    rest = cases
    while len(rest) == 1 and isinstance(rest[0], ir.If):
        branches.append((rest[0].cond, rest[0].then))
        rest = rest[0].orelse
    if rest or len(branches) < 2:
        return cases
    body = branches[0][1]
    if any(b != body for _, b in branches[1:]):
        return cases
    if not all(any(cond == d for cond, _ in branches) for d in drivers):
        return cases
    return body
