"""Rows in groups: a parallel loop over rows whose inner loops do not depend on the row
runs a few rows in lock step, for the CPU targets.

A fixed-width level (``ell(w)``, ``nm(n,m)``; ``ucf.format.levels.fixed``) gives every
row the same number of entries, at positions ``row * w + s``: the loops inside a row
have trip counts that do not vary with the row. So ``R`` rows can walk their entries
together, jammed into one loop nest (unroll and jam). The parallel loop's iterations
are independent (it is ``NoRaces``), so any interleaving of them computes the same.
Two shapes gain:

- A row summed into a scalar (ELL SpMV: ``t += A[p] * x[crd[p]]``): one row is a
  chain of dependent adds, as slow as the add's latency; ``R`` rows are ``R``
  independent chains.
- A row accumulated into a row of the output at unit stride (N:M SpMM:
  ``C[i, j] += A[p] * B[k, j]`` over ``j``): a tile of ``R`` rows by a few vectors of
  ``j`` stays in registers over the whole reduction nest (every entry of the rows),
  each entry's value broadcast, and is stored once; the CSR kernel instead loads and
  stores a row of C for every entry. A tile reads a narrow panel of B's columns from
  every row of B; B's rows lie a power of two apart in memory more often than not
  (1024 floats), and a panel cut out of them falls into a few cache sets, so B is
  first copied into contiguous panels, one per tile of columns.

Each output element still sums its terms in the same order, each a fused multiply-add
as in the ungrouped kernel (``ucf.passes.fma``), so the result is bit for bit the
ungrouped kernel's. Columns after the last whole tile take narrower tiles where
their count is a constant (a ``bound`` loop); rows that fill no group, and columns
of a loop whose trip count varies, run in the original nest. Which loops and nests
have either shape is read in ``ucf.passes.row_nests``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import declared, names, nodes, substitute, with_blocks
from ucf.passes.row_nests import Level, Tile, chains, nest_of, row_loop, tile_of
from ucf.passes.tiling import SIZES, VECTOR_BYTES, enabled, unit_offset, vector_of

#: Rows per group of a scalar sum: independent add chains in flight (latency 3-4
#: cycles, two adders).
CHAIN_ROWS = 4
#: Rows per group, and vectors of ``j`` per row, of an output tile: the accumulators,
#: one vector of the other factor and a broadcast fit in x86-64's 16 vector registers.
TILE_ROWS = 3
TILE_VECTORS = 4
#: Loops over a row's slots with at most this many iterations (N:M's n) are unrolled.
MAX_UNROLL = 4
#: Groups of rows per chunk a thread takes with one tile of columns.
CHUNK = 16


def group_rows(fn: ir.Function, dense: bool = False) -> tuple[ir.Function, list[str]]:
    """``fn`` with each parallel loop over rows of either shape run in groups, and a
    line per loop saying so (for ``k.cin``); ``fn`` as it is when register blocking is
    off (``UCF_REGISTER_BLOCKING=0``). ``dense`` (every operand dense: GEMV, row sums
    and maxima): rows summed into scalars only. Serial loops whose rows are independent
    are grouped too (``ucf.lower.parallel.mark_independent`` marks them): one thread
    gains the independent chains as much as many do."""
    if not enabled():
        return fn, []
    taken = declared(fn.body) | {p.name for p in fn.params}
    rewriter = _Rewriter(taken, fn.params, dense)
    return replace(fn, body=rewriter.block(fn.body)), rewriter.notes


def _shape(tile: Tile) -> tuple[int, int]:
    """Rows and vectors of ``j`` of a tile: ``TILE_ROWS`` x ``TILE_VECTORS``, or, where
    ``j``'s trip count is a constant narrower than that (a bounded loop: SpMM by 16
    float32 columns, whose rows else ran in the original nest, one chain of
    multiply-adds each), those of ``_shape_of``."""
    lanes = VECTOR_BYTES // SIZES[tile.store.array.elem]
    span = ir.sub(tile.inner.end, tile.inner.start)
    if isinstance(span, Const) and lanes <= span.value:
        return _shape_of(span.value, lanes)
    return TILE_ROWS, TILE_VECTORS


def _shape_of(columns: int, lanes: int) -> tuple[int, int]:
    """The tile over ``columns`` (at least one vector of ``lanes``): as many vectors as
    they fill, up to ``TILE_VECTORS``, and as many more rows as keep the accumulators'
    count (12 x 1, 6 x 2, 4 x 3)."""
    vectors = min(columns // lanes, TILE_VECTORS)
    return TILE_ROWS * TILE_VECTORS // vectors, vectors


@dataclass
class _Packed:
    """The factor a tile reads along ``j``: its ``load``, which reads row ``row`` at
    ``row * stride + j`` of an array of ``rows`` rows, and the array of its panels."""

    load: ir.Load
    row: ir.Expr
    stride: Var
    rows: ir.Expr
    panel: ir.Array


def _one_lane(e: ir.Expr) -> ir.Expr:
    """``e``, built of vectors of one lane, as scalars: a narrow tile's last column."""
    if isinstance(e, ir.VLoad):
        return ir.Load(e.array, e.index)
    if isinstance(e, ir.Splat):
        return _one_lane(e.operand)
    if isinstance(e, ir.Cast):
        return ir.Cast(_one_lane(e.operand), ir.element(e.type))
    if isinstance(e, ir.Bin | ir.PairDot):
        return replace(e, left=_one_lane(e.left), right=_one_lane(e.right))
    if isinstance(e, ir.Neg):
        return ir.Neg(_one_lane(e.operand))
    return e


def _replace_node(e, old, new):
    """``e`` with every occurrence of the node ``old`` replaced by ``new``."""
    if e == old:
        return new
    if isinstance(e, ir.Expr) and not isinstance(e, Var | Const):
        return replace(
            e,
            **{
                f.name: _replace_node(getattr(e, f.name), old, new)
                for f in fields(e)
                if isinstance(getattr(e, f.name), ir.Expr)
            },
        )
    return e


def _retarget(stmts: list[ir.Stmt], loop: ir.For, start: ir.Expr) -> list[ir.Stmt]:
    """``stmts`` with the loop ``loop`` in them starting at ``start``."""
    out = []
    for s in stmts:
        if s is loop:
            s = replace(s, start=start)
        elif isinstance(s, ir.For):
            s = replace(s, body=_retarget(s.body, loop, start))
        out.append(s)
    return out


class _Rewriter:
    def __init__(self, taken: set[str], params: list[ir.Param], dense: bool = False):
        self.taken = taken
        self.dense = dense
        self.notes: list[str] = []
        # Each dense tensor's values array, and the names of its extents by mode.
        self.tensors = {p.name: p.role[1] for p in params if p.role[:1] == ("vals",)}
        self.dims: dict[str, list[str]] = {}
        for p in params:
            if p.role[:1] == ("dim",):
                self.dims.setdefault(p.role[1], []).append(p.name)

    def fresh(self, name: str) -> Var:
        k = 0
        while f"{name}_g{k}" in self.taken:
            k += 1
        self.taken.add(f"{name}_g{k}")
        return Var(f"{name}_g{k}", I64)

    def block(self, stmts: list[ir.Stmt]) -> list[ir.Stmt]:
        out: list[ir.Stmt] = []
        for s in stmts:
            grouped = self.grouped(s) if row_loop(s) else None
            out += [with_blocks(s, self.block)] if grouped is None else grouped
        return out

    def grouped(self, loop: ir.For) -> list[ir.Stmt] | None:
        row = loop.var.name
        nest = nest_of(loop.body, {row})
        if nest is None:
            return None
        name = loop.label or row
        tile = None if self.dense else tile_of(nest)
        packed = None if tile is None else self.packing(tile)
        if packed is not None:
            j = tile.inner.label or tile.inner.var.name
            rows, vectors = _shape(tile)
            self.notes.append(
                f"row groups: {tile.store.array.name.removesuffix('_vals')} is accumulated in "
                f"tiles of {rows} rows ({name}) x {vectors} vectors of {j}, held in "
                f"registers over the rows' entries; {packed.load.array.name} is copied tile by "
                f"tile of {j} into contiguous panels first"
            )
            return self.tiled(loop, nest, tile, packed, rows, vectors)
        if not chains(nest, row):
            return None
        rows = CHAIN_ROWS
        self.notes.append(f"row groups: {rows} rows ({name}) sum their entries side by side")
        group = self.fresh(f"{row}_group")
        decls, maps = self.rows(loop, group, rows)
        body = [*decls, *self.jam(nest, maps)]
        kind, chunk = loop.schedule
        groups = ir.Bin("/", ir.sub(loop.end, loop.start), Const(rows, I64))
        par = replace(loop, var=group, start=Const(0, I64), end=groups, body=body)
        par.schedule = (kind, max(chunk // rows, 1) if chunk else 0)
        rest = ir.add(loop.start, ir.mul(groups, Const(rows, I64)))
        return [par, replace(loop, start=rest, parallel=None, strategy="", parallel_if=None)]

    def rows(self, loop: ir.For, group: Var, rows: int) -> tuple[list[ir.Decl], list[dict]]:
        """The declarations of a group's rows (``start + group * rows + r``) and the
        renaming of the row variable for each."""
        decls, maps = [], []
        first = ir.add(loop.start, ir.mul(group, Const(rows, I64)))
        for r in range(rows):
            var = self.fresh(loop.var.name)
            decls.append(ir.Decl(var, ir.add(first, Const(r, I64))))
            maps.append({loop.var.name: var})
        return decls, maps

    def copy(self, stmts: list[ir.Stmt], m: dict) -> list[ir.Stmt]:
        """``stmts`` for one row: renamed by ``m``, each declaration a fresh variable
        that ``m`` maps to from then on."""
        out = []
        for s in stmts:
            s = substitute(s, m)
            if isinstance(s, ir.Decl):
                var = replace(self.fresh(s.var.name), type=s.var.type)
                m[s.var.name] = var
                s = ir.Decl(var, s.init)
            out.append(s)
        return out

    def jam(self, nest: Level, maps: list[dict], hook=None, at=None) -> list[ir.Stmt]:
        """``nest`` for every row of a group in lock step (``maps`` rename each row's
        variables, and grow with its declarations); at the level ``at``, after its
        declarations, ``hook(maps)`` gives the statements instead of its loop."""
        out: list[ir.Stmt] = []
        for m in maps:
            out += self.copy(nest.prefix, m)
        if nest is at:
            return out + hook(maps)
        if nest.loop is None:
            return out + [s for m in maps for s in self.copy(nest.suffix, m)]
        loop, head = nest.loop, []
        var, start, end = loop.var, loop.start, loop.end
        if not nest.shared and isinstance(end := nest.trip, Const) and end.value <= MAX_UNROLL:
            # A few slots (N:M's n): unrolled, each a copy of the body for every row.
            for slot in range(int(end.value)):
                copies = [dict(m) for m in maps]
                for m in copies:
                    own = self.fresh(loop.var.name)
                    out.append(ir.Decl(own, ir.add(substitute(loop.start, m), Const(slot, I64))))
                    m[loop.var.name] = own
                out += self.jam(nest.child, copies, hook, at)
            return out + [s for m in maps for s in self.copy(nest.suffix, m)]
        if not nest.shared:
            var, start, end = self.fresh(loop.var.name), Const(0, I64), nest.trip
            for m in maps:
                own = self.fresh(loop.var.name)
                head.append(ir.Decl(own, ir.add(substitute(loop.start, m), var)))
                m[loop.var.name] = own
        body = [*head, *self.jam(nest.child, maps, hook, at)]
        out.append(replace(loop, var=var, start=start, end=end, body=body))
        return out + [s for m in maps for s in self.copy(nest.suffix, m)]

    def packing(self, tile: Tile) -> _Packed | None:
        """How the one factor that varies with ``j`` is copied into panels: its load
        must read row ``r`` of a dense array at ``r * stride + j``, ``stride`` the
        extent of one of its modes (the others give the number of rows)."""
        j = tile.inner.var.name
        varying = {
            n for n in nodes(tile.store.value) if isinstance(n, ir.Load) and j in names(n.index)
        }
        if len(varying) != 1:
            return None
        load = varying.pop()
        base = unit_offset(load.index, j)
        if not (isinstance(base, ir.Bin) and base.op == "*" and isinstance(base.right, Var)):
            return None
        tensor = self.tensors.get(load.array.name)
        dims = self.dims.get(tensor, [])
        if base.right.name not in dims:
            return None
        rows: ir.Expr = Const(1, I64)
        for d in dims:
            if d != base.right.name:
                rows = ir.mul(rows, Var(d, I64))
        panel = ir.Array(f"{load.array.name}_panels_g{len(self.notes)}", load.array.elem)
        return _Packed(load, base.left, base.right, rows, panel)

    def tiled(
        self, loop: ir.For, nest: Level, tile: Tile, packed: _Packed, rows: int, vectors: int
    ) -> list[ir.Stmt]:
        """The row loop as tile passes (``tile_pass``): the whole tiles of ``j``; where
        ``j``'s trip count is a constant, the columns after them in narrower tiles with
        more rows (``_shape_of``), each over the rows the pass before grouped: whole
        vectors, then a half, a quarter... of one, down to scalars. Then the original
        loop over what no tile covers (the rows left over). Those columns ran in the
        original loop, one chain of multiply-adds per row and column through memory:
        N:M SpMM 2000 x 512 by 40 to 255 columns, one thread, ran 1.2-3.5x slower
        than by the nearest multiple of a tile (float64 by 40: 2.6 ms, by 48: 1.2)."""
        lanes = VECTOR_BYTES // SIZES[tile.store.array.elem]
        j, w = tile.inner, vectors * lanes
        span = ir.sub(j.end, j.start)
        whole = ir.Bin("/", span, Const(w, I64))
        stmts, grouped = self.tile_pass(
            loop, nest, tile, packed, (rows, vectors, lanes), loop.end, whole
        )
        after = ir.add(j.start, ir.mul(whole, Const(w, I64)))
        row = Var(loop.var.name, I64)
        start = ir.Select(ir.Cmp("<", row, grouped), after, j.start)
        left = span.value % w if isinstance(span, Const) else 0
        narrower = []
        while left:
            # The columns left: whole vectors, then halves, quarters of one, down to
            # scalars, in narrow tiles over the rows grouped so far.
            while lanes > left:
                lanes //= 2
            rows, vectors = _shape_of(left - left % lanes, lanes)
            panel = ir.Array(f"{packed.panel.name}_{left}", packed.panel.elem)
            narrow = replace(packed, panel=panel)
            more, grouped = self.tile_pass(
                loop, nest, tile, narrow, (rows, vectors, lanes), grouped, Const(1, I64), after
            )
            stmts += more
            narrower.append(f"{rows} rows x {vectors} of {lanes} lanes")
            after = ir.add(after, Const(vectors * lanes, I64))
            start = ir.Select(ir.Cmp("<", row, grouped), after, start)
            left -= vectors * lanes
        if narrower:
            self.notes[-1] += (
                f"; the {span.value % w} columns after the whole tiles in narrower tiles "
                f"({', '.join(narrower)})"
            )
        first_row = ir.Select(ir.Cmp("<", after, j.end), loop.start, grouped)
        rest = replace(loop, start=first_row, body=_retarget(loop.body, j, start))
        return [*stmts, rest]

    def tile_pass(
        self,
        loop: ir.For,
        nest: Level,
        tile: Tile,
        packed: _Packed,
        shape: tuple[int, int, int],
        end: ir.Expr,
        tiles: ir.Expr,
        col0: ir.Expr | None = None,
    ) -> tuple[list[ir.Stmt], ir.Expr]:
        """``tiles`` tiles of ``vectors`` vectors of ``j`` from ``col0`` (``j``'s start) on,
        over the groups of ``rows`` rows from the loop's start to ``end``, and the row
        after the last group: the factor copied into panels of whole tiles (panel
        ``t`` holds every row's columns of tile ``t``, contiguous); a parallel loop over
        (tile, chunk of ``CHUNK`` groups of rows) pairs, tile by tile, so a thread
        reuses one panel from its L2 cache for many rows, each group accumulating a
        tile of ``rows`` x ``vectors`` in registers over every entry of its rows."""
        store, j = tile.store, tile.inner
        col0 = j.start if col0 is None else col0
        rows, vectors, lanes = shape
        one = _one_lane if lanes == 1 else (lambda e: e)
        width = Const(vectors * lanes, I64)
        groups = ir.Bin("/", ir.sub(end, loop.start), Const(rows, I64))
        chunks = ir.Bin("/", ir.add(groups, Const(CHUNK - 1, I64)), Const(CHUNK, I64))
        pair, at_tile = self.fresh(f"{loop.var.name}_tile"), self.fresh("j_tile")
        chunk, group, jv = self.fresh("chunk"), self.fresh("group"), self.fresh("j_vec")
        decls, maps = self.rows(loop, group, rows)
        # The panels: panel t, row r, place c holds the factor at row r, column
        # col0 + t * w + c, copied a vector at a time.
        t, r = self.fresh("panel"), self.fresh("panel_row")
        src = ir.add(ir.mul(r, packed.stride), ir.add(col0, ir.mul(t, width)))
        dst = ir.mul(ir.add(ir.mul(t, packed.rows), r), width)
        fill = [
            ir.Store(
                packed.panel,
                ir.add(dst, Const(v * lanes, I64)),
                one(ir.VLoad(packed.load.array, ir.add(src, Const(v * lanes, I64)), lanes)),
            )
            for v in range(vectors)
        ]
        pack = replace(
            loop,
            var=t,
            start=Const(0, I64),
            end=tiles,
            body=[ir.For(r, Const(0, I64), packed.rows, fill)],
            label="",
        )
        # In a tile, the factor's load reads the panel: row ``row`` at column ``j``.
        at_panel = ir.mul(ir.add(ir.mul(at_tile, packed.rows), packed.row), width)
        panel_load = ir.Load(packed.panel, ir.add(at_panel, Var(j.var.name, I64)))
        value = _replace_node(store.value, packed.load, panel_load)

        out: list[ir.Stmt] = [ir.Decl(jv, ir.add(col0, ir.mul(at_tile, width)))]
        for m in maps:
            out += self.copy(nest.prefix, m)
        acc: dict[tuple[int, int], Var] = {}
        tail: list[ir.Stmt] = []
        for k, m in enumerate(maps):
            base = substitute(tile.base, m)
            for v in range(vectors):
                at = ir.add(ir.add(base, jv), Const(v * lanes, I64))
                init = one(ir.VLoad(store.array, at, lanes))
                a = acc[k, v] = replace(self.fresh("acc"), type=init.type)
                out.append(ir.Decl(a, init))
                tail.append(ir.Store(store.array, at, a))

        def updates(inner_maps: list[dict]) -> list[ir.Stmt]:
            leaves: dict[ir.Expr, Var] = {}
            stmts: list[ir.Stmt] = []

            def leaf(e: ir.Expr) -> Var:
                e = one(e)
                if e not in leaves:
                    kind = "s" if ir.lanes(e.type) == 1 else "v"
                    leaves[e] = replace(self.fresh(kind), type=e.type)
                    stmts.append(ir.Decl(leaves[e], e))
                return leaves[e]

            adds: list[ir.Stmt] = []
            for k, m in enumerate(inner_maps):
                here = substitute(value, m)
                for v in range(vectors):
                    # j counts from the tile's first column in the panel.
                    term = one(
                        vector_of(here, j.var.name, Const(0, I64), v * lanes, lanes, leaf, {})
                    )
                    adds.append(ir.Assign(acc[k, v], ir.add_product(acc[k, v], term)))
            return [*stmts, *adds]

        out += self.jam(replace(nest, prefix=[]), [dict(m) for m in maps], updates, tile.level)
        out += tail
        first = ir.mul(chunk, Const(CHUNK, I64))
        last = ir.Bin("min", ir.add(first, Const(CHUNK, I64)), groups)
        body = [
            ir.Decl(at_tile, ir.Bin("/", pair, chunks)),
            ir.Decl(chunk, ir.Bin("%", pair, chunks)),
            ir.For(group, first, last, [*decls, *out]),
        ]
        kind, size = loop.schedule
        par = replace(loop, var=pair, start=Const(0, I64), end=ir.mul(tiles, chunks), body=body)
        par.schedule = (kind, 1 if size else 0)
        size = ir.mul(ir.mul(tiles, packed.rows), width)
        grouped = ir.add(loop.start, ir.mul(groups, Const(rows, I64)))
        # Every place of the panels is filled before any is read: no zeros first.
        return [ir.Alloc(packed.panel, size, False), pack, par, ir.Free(packed.panel)], grouped
