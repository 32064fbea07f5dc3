"""Register blocking of accumulation loop nests, for the CPU targets.

The lowerer's innermost loops follow the storage: for SpMM over ``bcsr`` they are
``i_in, k_in, j`` with ``C[i, j] += A[i, k] * B[k, j]`` innermost, so every
multiply-add loads and stores C.  A compiler vectorizes the ``j`` loop but keeps C
in memory, and the kernel runs at the speed of C's loads and stores, not of the
arithmetic.

This pass finds such nests, a loop ``j`` whose single statement accumulates into a
row of the output at unit stride, inside a short reduction loop of constant trip
count that leaves that row in place (a block's ``k_in``), optionally inside a loop
of constant trip count over rows (a block's ``i_in``), and rewrites them as a
micro-kernel: a tile of ``ROWS`` rows by a few vectors of ``j`` is loaded into
registers, the whole reduction loop adds into it (each factor that does not vary
with ``j`` loaded once and broadcast), and the tile is stored once.  The ``j`` that
do not fill a tile run in the original nest. Which nests match, and the tiles' shape:
``ucf.passes.register_nests``.

When several groups of rows share the other factor's rows (a block's ``B(k_blk, k_in, j)``),
those rows are read from a panel packed as BLAS packs its B panel (``ucf.passes.panels``):
once per call and thread for each block column where the panel depends on nothing else,
else before each block's rows. The factor each row broadcasts, when it too is computed (the
quantized block ``A`` of ``A(i,k) * B(k,j)``), is converted once per group of rows into a
buffer of the group's rows by the reduction's steps, not once per tile of ``j``.
Products of 8-bit integers into int32 take the micro-kernel of
``ucf.passes.pairs`` instead, two or four steps of the reduction per multiply.

Every output element still sums its terms in the same order, each a fused multiply-add
(``ir.add_product``) as the original nest's are after ``ucf.passes.fma``, so the result is
bit for bit the original's.  The vectors are LLIR vector types, which the LLVM and C
code generators print as LLVM vectors and GCC vector extensions.
"""

from __future__ import annotations

from dataclasses import replace

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import declared, names, substitute, with_blocks
from ucf.passes import first_write, panels
from ucf.passes.pairs import paired, quad_bytes, quads
from ucf.passes.panels import named, red_steps
from ucf.passes.register_nests import (
    VECTORS,
    WIDE_ROWS,
    coefficient,
    nest_of,
    row_base,
    row_dependent,
    tile_rows,
)
from ucf.passes.tiling import (
    SIZES,
    WIDE_BYTES,
    Nest,
    TileState,
    enabled,
    tile_bytes,
    trip_bound,
    trip_count,
    vector_of,
)

#: How many times cheaper a multiply-add in a tile is than one of the loops the work
#: threshold of parallel loops was measured on (``ucf.lower.work.WORK_THRESHOLD``,
#: serial SpMV and SpMM): a parallel loop around tiles starts its threads only
#: at this many times the threshold. bcsr(32,32) SpMM at 1024 with 16 blocks (16e6
#: multiply-adds) took 1.9 ms serial, and 5.6 to 10 ms on 2 threads of a loaded 2-core
#: machine; 2 threads won from about 64 blocks (bench: tesa_formats' 90 % case has 91).
TILE_WORK = 16


def register_block(fn: ir.Function) -> tuple[ir.Function, list[str], list[first_write.Claim]]:
    """``fn`` with every nest of the shape above turned into a register-blocked one,
    a line per nest saying so (for ``k.cin``), and the nests whose tiles may start from
    zeros (``first_write.apply``, once the output's zeroing is in place); ``fn`` as it is
    if not ``enabled``."""
    if not enabled():
        return fn, [], []
    taken = declared(fn.body) | {p.name for p in fn.params}
    extents = {p.role[1]: p.name for p in fn.params if p.role and p.role[0] == "extent"}
    rewriter = _Rewriter(taken, {p.name for p in fn.params}, extents)
    body = rewriter.block(fn.body)
    return replace(fn, body=rewriter.allocated(body)), rewriter.notes, rewriter.claims


class _Rewriter(TileState):
    """The pass over one function: each matched nest becomes a micro-kernel."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.claims: list[first_write.Claim] = []

    def block(self, stmts: list[ir.Stmt]) -> list[ir.Stmt]:
        out: list[ir.Stmt] = []
        for s in stmts:
            if isinstance(s, ir.Decl):  # what a panel's coordinate holds (``ahead``)
                self.defs[s.var.name] = s.init
            nest = nest_of(s) if isinstance(s, ir.For) else None
            if nest is not None:
                out += self.tiled(nest, s)
            elif isinstance(s, ir.For) and s.parallel == "CPUThread":
                outer, tiled = (self.panels, self.sizes, self.team, self.picks), self.tiles
                self.panels, self.sizes, self.team, self.picks = [], [], [], []
                loop = self.inside(s)
                out += self.team_allocs()  # the team's panels, before the threads start
                out.append(
                    replace(
                        loop,
                        prologue=[*loop.prologue, *self.allocs(), *self.picks],
                        epilogue=[*loop.epilogue, *self.frees()],
                        parallel_if=(
                            _cheaper(loop.parallel_if) if self.tiles > tiled else loop.parallel_if
                        ),
                    )
                )
                out += [ir.Free(p) for p, _ in self.team]
                self.panels, self.sizes, self.team, self.picks = outer
            else:
                out.append(self.inside(s))
        return out

    def inside(self, s: ir.Stmt) -> ir.Stmt:
        """``s`` with its statement lists rewritten, a loop known as enclosing them."""
        if not isinstance(s, ir.For):
            return with_blocks(s, self.block)
        self.loops.append(s)
        try:
            return with_blocks(s, self.block)
        finally:
            self.loops.pop()

    def tiled(self, nest: Nest, original: ir.For) -> list[ir.Stmt]:
        """The micro-kernel over whole tiles of ``j``, then ``original`` over the rest."""
        self.tiles += 1
        hoisted: list[ir.Stmt] = []
        in_original = nest.inner  # the j loop as ``original`` holds it
        if nest.rows is not None:
            nest, hoisted = self.hoisted(nest)
        j = nest.inner
        elem = nest.store.array.elem
        size = quad_bytes() if quads(nest) else tile_bytes(elem)
        lanes = size // SIZES[elem]
        rows = 1 if nest.rows is None else tile_rows(nest.rows, size == WIDE_BYTES)
        width = VECTORS[rows] * lanes
        over = (
            "" if nest.rows is None else f"{rows} rows ({nest.rows.label or nest.rows.var.name}) x "
        )
        self.notes.append(
            f"registers: {nest.store.array.name.removesuffix('_vals')} is accumulated over "
            f"{nest.red.label or nest.red.var.name} in tiles of {over}{width} "
            f"{j.label or j.var.name} held in registers"
        )
        span = ir.sub(j.end, j.start)
        end = Var(self.fresh("j_tiles_end"), I64)
        tile = Var(self.fresh("j_tile"), I64)
        jv = Var(self.fresh("j_vec"), I64)
        w = Const(width, I64)
        at = ir.Decl(jv, ir.add(j.start, ir.mul(tile, w)))
        count = ir.Bin("/", span, w)
        pack: list[ir.Stmt] = []
        head: list[ir.Stmt] = []
        zeros = None  # first_write's claim on the nest
        if nest.rows is None:
            micro = self.micro(nest, [{}], jv, lanes, {})
            tiles = ir.For(tile, Const(0, I64), count, [at, *micro])
        else:
            group = Var(self.fresh(f"{nest.rows.var.name}_group"), I64)
            first = ir.add(nest.rows.start, ir.mul(group, Const(rows, I64)))
            renames, decls = self.row_copies(nest, first, rows)
            trip = trip_count(nest.rows)
            shared = None if trip is None else trip // rows
            groups = None if shared is None else Const(shared, I64)
            if groups is None:  # rows not known until the call: whole groups, then the rest
                groups = Var(self.fresh(f"{nest.rows.var.name}_groups"), I64)
                done = Var(self.fresh(f"{nest.rows.var.name}_grouped"), I64)
                span_rows = ir.sub(nest.rows.end, nest.rows.start)
                head = [
                    ir.Decl(groups, ir.Bin("/", span_rows, Const(rows, I64))),
                    ir.Decl(done, ir.add(nest.rows.start, ir.mul(groups, Const(rows, I64)))),
                ]
                original, left = replace(original, end=done), replace(original, start=done)
            chunk = Var(self.fresh("j_chunk"), I64)
            by_pairs = paired(self, nest, tile, count, width, lanes)
            in_place = None  # where the tiles read the factors instead of their panels
            if by_pairs is not None:
                (kernel, packed, pack), per_chunk, fetch = by_pairs, 0, []
            else:
                wide = rows == WIDE_ROWS
                kernel, (packed, pack, per_chunk, fetch, in_place) = (
                    nest,
                    panels.packed(
                        self, nest, tile, count, width, lanes, shared, wide, chunk, group
                    ),
                )
            if pack and trip is None:  # no panel to fill for fewer rows than a tile
                places = [s for s in pack if isinstance(s, ir.Decl)]
                filling = [s for s in pack if not isinstance(s, ir.Decl)]
                pack = [*places, ir.If(ir.Cmp(">", groups, Const(0, I64)), filling)]
            converted, fill = ({}, []) if kernel is not nest else self.converted(nest, renames)
            stride = coefficient(row_base(nest), nest.rows.var.name)
            if trip is not None and not hoisted:  # a claim reads the nest where it starts
                zeros = first_write.claim(
                    self.fresh, self.loops, nest, original, row_base(nest), stride, width
                )
            if zeros is not None:
                self.claims.append(zeros)
            micro = self.micro(kernel, renames, jv, lanes, packed, converted, zeros)
            if in_place is not None:
                direct = self.micro(kernel, renames, jv, lanes, {}, converted, zeros)
                micro = [ir.If(in_place, direct, micro)]
            # Tiles inside the rows: one group sweeps its rows of the output along j,
            # and the rows of the other factor in step. The other order (each tile of
            # j serving every group, to reuse the other factor's tile from L1) measured
            # slower on bcsr(32,32) SpMM at 1024 (32.2 against 27.7 ms, 50% of blocks):
            # rows 4 KB apart fall into one L1 set, so that tile does not stay there.
            if packed and per_chunk:  # the groups run over each chunk of a bounded panel
                lo = ir.mul(chunk, Const(per_chunk, I64))
                hi = ir.Bin("min", count, ir.add(lo, Const(per_chunk, I64)))
                inner = ir.For(tile, lo, hi, [at, *fetch, *micro])
            else:
                inner = ir.For(tile, Const(0, I64), count, [at, *fetch, *micro])
            tiles = ir.For(group, Const(0, I64), groups, [*decls, *fill, inner])
            if packed and per_chunk:
                chunks = ir.Bin(
                    "/", ir.add(count, Const(per_chunk - 1, I64)), Const(per_chunk, I64)
                )
                tiles, pack = ir.For(chunk, Const(0, I64), chunks, [*pack, tiles]), []
        rest = _with_start(original, in_original, end)
        out: list[ir.Stmt] = [
            ir.Decl(end, ir.add(j.start, ir.mul(ir.Bin("/", span, w), w))),
            *pack,
            tiles,
            ir.If(ir.Cmp("<", end, j.end), [rest]),
        ]
        if nest.rows is None:
            return out
        if head:
            out = [*head, *out, left]
        # Rows must be distinct places for their tiles to be distinct registers.
        stride = coefficient(row_base(nest), nest.rows.var.name)
        guarded: list[ir.Stmt] = [ir.If(ir.Cmp(">=", stride, span), out, [nest.rows])]
        # the flag of first_write, 0 until it finds the output's zeroing before the loop
        flagged = guarded if zeros is None else [ir.Decl(zeros.flag, Const(0, I64)), *guarded]
        return [*hoisted, *flagged]

    def hoisted(self, nest: Nest) -> tuple[Nest, list[ir.Stmt]]:
        """``nest`` without the declarations of its row loop that do not depend on the row
        (a split reduction's block start ``k_base`` of dense GEMM, which the lowerer
        declares at its first use, inside the rows), and those declarations under fresh
        names, to come before the tiles: a tile's rows share them."""
        dependent = row_dependent(nest.rows, nest.row_decls)
        mapping: dict[str, ir.Expr] = {}
        hoisted: list[ir.Stmt] = []
        kept: list[ir.Decl] = []
        for d in nest.row_decls:
            init = substitute(d.init, mapping)
            if d.var.name in dependent:
                kept.append(replace(d, init=init))
            else:
                var = Var(self.fresh(d.var.name), d.var.type)
                hoisted.append(ir.Decl(var, init))
                mapping[d.var.name] = var
        if not hoisted:
            return nest, []
        moved = replace(
            nest,
            row_decls=kept,
            red=substitute(nest.red, mapping),
            red_decls=substitute(nest.red_decls, mapping),
            inner=substitute(nest.inner, mapping),
            store=substitute(nest.store, mapping),
            base=substitute(nest.base, mapping),
        )
        return moved, hoisted

    def row_copies(self, nest: Nest, first: ir.Expr, rows: int):
        """Per row of a tile: the renaming of the row loop's variable and declarations,
        and the declarations that define the copies."""
        renames, decls = [], []
        for r in range(rows):
            var = Var(self.fresh(f"{nest.rows.var.name}_r"), I64)
            mapping: dict[str, ir.Expr] = {nest.rows.var.name: var}
            decls.append(ir.Decl(var, ir.add(first, Const(r, I64))))
            for d in nest.row_decls:
                copy = Var(self.fresh(d.var.name), d.var.type)
                decls.append(ir.Decl(copy, substitute(d.init, mapping)))
                mapping[d.var.name] = copy
            renames.append(mapping)
        return renames, decls

    def converted(
        self, nest: Nest, renames: list[dict]
    ) -> tuple[dict[ir.Expr, tuple[ir.Array, int]], list[ir.Stmt]]:
        """The factors each row's tiles broadcast that cost a computation per use (a
        quantized block's ``(q - zero) * scale``, read as ``A`` of ``A(i,k) * B(k,j)``),
        each with a buffer of the group's rows by the reduction's steps, and the loop that
        fills it once per group of rows: every tile of ``j`` would convert them again
        (8 times for 128 columns). Empty where the reduction's range depends on the
        row, or no factor computes more than a load."""
        red = nest.red
        rowwise = {nest.rows.var.name} | {d.var.name for d in nest.row_decls}
        depth = trip_bound(red)
        if depth is None or (names(red.start) | names(red.end)) & rowwise:
            return {}, []
        steps = red_steps(nest)
        j = nest.inner.var.name
        found = [
            f
            for f in dict.fromkeys(_broadcast(nest.store.value, j))
            if red.var.name in names(substitute(f, steps)) and _computes(f)
        ]
        if not found:
            return {}, []
        rows, step = len(renames), Var(self.fresh(red.var.name), I64)
        buffers: dict[ir.Expr, tuple[ir.Array, int]] = {}
        stores: list[ir.Stmt] = []
        for f in found:
            buffer = ir.Array(self.fresh("converted"), f.type)
            self.panels.append(buffer)
            self.sizes.append(Const(rows * depth, I64))
            buffers[f] = (buffer, depth)
            source = substitute(f, steps)
            for r, mapping in enumerate(renames):
                value = substitute(source, {**mapping, red.var.name: step})
                at = ir.add(Const(r * depth, I64), ir.sub(step, red.start))
                stores.append(ir.Store(buffer, at, value))
        self.notes.append(
            f"registers: {', '.join(named(f) for f in found)} converted once per group of "
            f"{rows} rows ({nest.rows.label or nest.rows.var.name}), not per tile"
        )
        return buffers, [ir.For(step, red.start, red.end, stores)]

    def micro(
        self,
        nest: Nest,
        renames: list[dict],
        jv: Var,
        lanes: int,
        packed: dict[ir.Expr, tuple[ir.Array, ir.Expr]],
        converted: dict[ir.Expr, tuple[ir.Array, int]] | None = None,
        first: first_write.Claim | None = None,
    ) -> list[ir.Stmt]:
        """Load the tile at ``jv`` for each row (``renames``; zeros where ``first``'s
        flag is set), run the reduction loop into it (the loads in ``packed`` from their
        panels, the factors in ``converted`` from their row group's buffer), store it."""
        store, j = nest.store, nest.inner.var.name
        vectors = VECTORS[len(renames)]
        acc: dict[tuple[int, int], Var] = {}
        head: list[ir.Stmt] = []
        loads: list[ir.Stmt] = []
        tail: list[ir.Stmt] = []
        for r, mapping in enumerate(renames):
            base = substitute(nest.base, mapping)
            for v in range(vectors):
                a = Var(self.fresh("acc"), ir.vector(store.array.elem, lanes))
                at = ir.add(ir.add(base, jv), Const(v * lanes, I64))
                acc[r, v] = a
                decl, load = first_write.tile_start(first, a, ir.VLoad(store.array, at, lanes))
                head.append(decl)
                loads += load
                tail.append(ir.Store(store.array, at, a))
        if first is not None:
            head.append(ir.If(first_write.later(first), loads))
        decls: list[ir.Stmt] = []
        leaves: dict[ir.Expr, Var] = {}

        def leaf(e: ir.Expr, name: str = "") -> Var:
            """``e`` declared once in the reduction loop (rows that need the same value
            share it)."""
            if e not in leaves:
                leaves[e] = Var(self.fresh(name or ("s" if ir.lanes(e.type) == 1 else "v")), e.type)
                decls.append(ir.Decl(leaves[e], e))
            return leaves[e]

        updates: list[ir.Stmt] = []
        places = {f: Var(self.fresh("converted_at"), f.type) for f in converted or {}}
        step = ir.sub(nest.red.var, nest.red.start)
        for r, mapping in enumerate(renames):
            local = dict(mapping)
            for d in nest.red_decls:
                local[d.var.name] = leaf(substitute(d.init, local), d.var.name)
            for factor, (buffer, depth) in (converted or {}).items():
                at = ir.add(Const(r * depth, I64), step)
                local[places[factor].name] = ir.Load(buffer, at)
            value = substitute(_swapped(store.value, places), local)
            panels = {substitute(e, local): at for e, at in packed.items()}
            for v in range(vectors):
                args = (j, jv, v * lanes, lanes, leaf, panels)
                if isinstance(value, ir.QuadDot):  # it adds into the accumulator itself
                    u, s = vector_of(value.unsigned, *args), vector_of(value.signed, *args)
                    update = ir.QuadDot(u, s, acc[r, v])
                else:
                    update = ir.add_product(acc[r, v], vector_of(value, *args))
                updates.append(ir.Assign(acc[r, v], update))
        red = replace(nest.red, body=[*decls, *updates])
        return [*head, red, *tail]


def _cheaper(cond: ir.Expr | None) -> ir.Expr | None:
    """A parallel loop's condition to start threads, ``work >= threshold``, with the
    threshold ``TILE_WORK`` times higher."""
    if isinstance(cond, ir.Cmp) and isinstance(cond.right, Const):
        return replace(cond, right=Const(cond.right.value * TILE_WORK, cond.right.type))
    return cond


def _with_start(s: ir.For, inner: ir.For, start: ir.Expr) -> ir.For:
    """``s`` with its loop ``inner`` starting at ``start``."""
    if s is inner:
        return replace(s, start=start)
    return replace(
        s, body=[_with_start(x, inner, start) if isinstance(x, ir.For) else x for x in s.body]
    )


def _broadcast(e: ir.Expr, j: str) -> list[ir.Expr]:
    """The largest parts of ``e`` that do not vary with ``j``: what ``vector_of``
    broadcasts."""
    if j not in names(e):
        return [e]
    if isinstance(e, ir.Bin | ir.PairDot):
        return _broadcast(e.left, j) + _broadcast(e.right, j)
    if isinstance(e, ir.Cast | ir.Neg):
        return _broadcast(e.operand, j)
    return []


def _computes(e: ir.Expr) -> bool:
    """Whether ``e`` does more than load (and widen) one value."""
    while isinstance(e, ir.Cast):
        e = e.operand
    return not isinstance(e, ir.Load | Var | Const)


def _swapped(e: ir.Expr, table: dict[ir.Expr, ir.Expr]) -> ir.Expr:
    """``e`` with each of its parts in ``table`` replaced, through the nodes ``vector_of``
    walks."""
    if e in table:
        return table[e]
    if isinstance(e, ir.Bin | ir.PairDot):
        return replace(e, left=_swapped(e.left, table), right=_swapped(e.right, table))
    if isinstance(e, ir.Cast | ir.Neg):
        return replace(e, operand=_swapped(e.operand, table))
    return e
