"""What the register tiles of ``registers``, ``pairs`` and ``row_groups`` share: the
vector width, the matched nest, the loop and expression shapes they recognize, lane
by lane expressions, and the state of a rewrite (fresh names, per-thread panels).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import cache

import llvmlite.binding as llvm

from ucf.errors import UcfError
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import assigned, fresh_name, names, nodes, substitute

#: The width of a vector register the tiles are cut for (AVX2's; an AVX-512 machine
#: runs two of them per register, a narrower one splits them).
VECTOR_BYTES = 32

#: The width of the float tiles' vectors on a host with AVX-512F: 32 registers of 64
#: bytes. bcsr(32,32) SpMM at 1024, float32, one thread (process CPU time) ran 1.5x
#: faster with them, at 90 % and at 50 % zero blocks, on this project's Zen 5 machine,
#: whose FMA units are 512 bits wide: about 40 % and 45 % of its 512-bit FMA peak of
#: bench/fma_peak.py (270 GFLOP/s), from about 25 % and 28 %.
WIDE_BYTES = 64


def host_features() -> str:
    """The host CPU's features as LLVM spells them; empty on a host llvmlite cannot
    describe."""
    try:
        return llvm.get_host_cpu_features().flatten()
    except RuntimeError:
        return ""


@cache
def tile_bytes(elem: str) -> int:
    """The width of the vectors of a register tile accumulating ``elem``:
    ``WIDE_BYTES`` for floats where the host has AVX-512F (the JIT compiles for the
    host, the C target with ``-march=native``), else ``VECTOR_BYTES``. Integer tiles keep
    ``VECTOR_BYTES``, the width of ``pmaddwd``'s pairs; quads of ``ucf.passes.pairs`` take
    ``pairs.quad_bytes`` instead. The kernel cache keys on it."""
    if elem in ir.FLOAT_TYPES and "+avx512f" in host_features().split(","):
        return WIDE_BYTES
    return VECTOR_BYTES


#: Output types the tiles accumulate in.
ACCUMULATE = ("f32", "f64", "i32", "i64")

SIZES = {"f32": 4, "f64": 8, "i32": 4, "i64": 8}


def enabled() -> bool:
    """Whether the pass runs: ``UCF_REGISTER_BLOCKING=0`` turns it off, to measure what
    it gains (bench/tesa_formats.py --unblocked). The kernel cache keys on it."""
    text = os.environ.get("UCF_REGISTER_BLOCKING", "1").strip()
    if text not in ("0", "1"):
        raise UcfError(f"UCF_REGISTER_BLOCKING={text!r}: register blocking is 1 (on) or 0 (off)")
    return text == "1"


@dataclass
class Nest:
    """A matched nest: the optional loop over rows, the reduction loop, the loop over
    ``j``, the declarations that open each, and the accumulating store (with the ``j``
    loop's own declarations substituted), whose index is ``base + j``."""

    rows: ir.For | None
    row_decls: list[ir.Decl]
    red: ir.For
    red_decls: list[ir.Decl]
    inner: ir.For
    store: ir.Store
    base: ir.Expr


def serial_loop(s: ir.Stmt) -> bool:
    """A serial loop with nothing but its body."""
    return (
        isinstance(s, ir.For)
        and s.parallel is None
        and not (s.prologue or s.epilogue or s.reduction or s.unroll)
        and s.parallel_if is None
    )


def trip_count(s: ir.For) -> int | None:
    if isinstance(s.start, Const) and isinstance(s.end, Const):
        return int(s.end.value) - int(s.start.value)
    return None


def trip_bound(s: ir.For) -> int | None:
    """A constant bound on the trip count of ``s``: its trip count, or the constant its
    end is clipped to (a block's places, clipped at a partial block)."""
    end = s.end
    if isinstance(end, ir.Bin) and end.op == "min" and isinstance(end.left, Const):
        end = end.left
    return trip_count(replace(s, end=end))


def unit_offset(e: ir.Expr, v: str) -> ir.Expr | None:
    """``base`` such that ``e == base + v`` with ``v`` not in ``base``, or None."""
    if isinstance(e, Var) and e.name == v:
        return Const(0, I64)
    if isinstance(e, ir.Bin) and e.op in "+-":
        left, right = v in names(e.left), v in names(e.right)
        if left and not right:
            base = unit_offset(e.left, v)
            if base is not None:
                return ir.add(base, e.right) if e.op == "+" else ir.sub(base, e.right)
        if right and not left and e.op == "+":
            base = unit_offset(e.right, v)
            if base is not None:
                return ir.add(e.left, base)
    return None


def accumulation(inner: ir.For) -> tuple[ir.Store, ir.Expr] | None:
    """The store that ends ``inner``'s body, adding into a row of the output at its
    variable ``j`` (``base + j``), with the declarations before it substituted,
    and that base; None unless the body is declarations then such a store (non-atomic,
    into an ``ACCUMULATE`` type, of a value that does not read the output). Whether the
    value is ``lanewise`` is the caller's to ask."""
    if not serial_loop(inner) or not inner.body:
        return None
    mapping: dict[str, ir.Expr] = {}
    for d in inner.body[:-1]:
        if not isinstance(d, ir.Decl):
            return None
        mapping[d.var.name] = substitute(d.init, mapping)
    store = inner.body[-1]
    if not isinstance(store, ir.Store) or not store.accumulate or store.atomic:
        return None
    store = replace(
        store, index=substitute(store.index, mapping), value=substitute(store.value, mapping)
    )
    j = inner.var.name
    elem = store.array.elem
    base = unit_offset(store.index, j)
    if base is None or elem not in ACCUMULATE or store.value.type != elem:
        return None
    if loads_from(store.value, store.array.name):
        return None
    return store, base


def loads_from(e: ir.Expr, array: str) -> bool:
    return any(isinstance(n, ir.Load) and n.array.name == array for n in nodes(e))


def lanewise(e: ir.Expr, j: str, out: str) -> bool:
    """Whether ``e`` computes lane by lane over ``j``: loads at unit stride in ``j`` and
    arithmetic on them; whatever does not vary with ``j`` is a broadcast scalar."""
    if loads_from(e, out):
        return False
    if j not in names(e):
        return True
    if isinstance(e, ir.Load):
        return e.array.elem in ir.VECTOR_ELEMENTS and unit_offset(e.index, j) is not None
    if isinstance(e, ir.Cast):
        return ir.element(e.type) in ir.VECTOR_ELEMENTS and lanewise(e.operand, j, out)
    # max and min too: relu(T) read in a product (``ucf.lower.elementwise``), which the
    # code generators lower lane by lane as their scalars, NaN picking the second operand.
    if isinstance(e, ir.Bin) and e.op in ("+", "-", "*", "max", "min"):
        return lanewise(e.left, j, out) and lanewise(e.right, j, out)
    if isinstance(e, ir.Neg):
        return lanewise(e.operand, j, out)
    return False


def vector_of(e: ir.Expr, j: str, jv: Var, off: int, lanes: int, leaf, packed: dict) -> ir.Expr:
    """``e`` over the ``lanes`` values of ``j`` from ``jv + off`` on (``lanewise``);
    ``leaf`` declares a loaded vector or a scalar once and names it; a load in ``packed``
    reads its panel, whose row for the tile at ``jv`` starts at the place given."""
    if j not in names(e):
        return ir.Splat(leaf(e), lanes)
    if e in packed:
        panel, row = packed[e]
        return leaf(ir.VLoad(panel, ir.add(row, Const(off, I64)), lanes))
    if isinstance(e, ir.Load):
        at = ir.add(jv, Const(off, I64))
        return leaf(ir.VLoad(e.array, ir.add(unit_offset(e.index, j), at), lanes))
    args = (j, jv, off, lanes, leaf, packed)
    if isinstance(e, ir.Cast):
        return ir.Cast(vector_of(e.operand, *args), ir.vector(e.type, lanes))
    if isinstance(e, ir.Bin | ir.PairDot):
        return replace(e, left=vector_of(e.left, *args), right=vector_of(e.right, *args))
    return ir.Neg(vector_of(e.operand, *args))


class TileState:
    """What a rewrite into tiles keeps while it walks a function: the names taken, the
    function's parameters and its extents (by index variable), a note per rewritten nest
    (for ``k.cin``), and the panels of the nests rewritten so far, allocated at the top
    of the function or, inside a parallel loop, in its per-thread setup; there, the
    panels the team shares (``team``, allocated before the loop) and each thread's
    choice between them and its own (``picks``, ``ucf.passes.panels``)."""

    def __init__(self, taken: set[str], params: set[str], extents: dict[str, str] | None = None):
        self.taken = taken
        self.params = params
        self.extents = extents or {}  # index variable -> the parameter of its extent
        self.notes: list[str] = []
        self.panels: list[ir.Array] = []
        self.sizes: list[ir.Expr] = []
        self.unzeroed: set[str] = set()  # panels every read of which follows a write
        self.team: list[tuple[ir.Array, ir.Expr]] = []
        self.picks: list[ir.Stmt] = []
        self.tiles = 0  # nests rewritten so far
        self.loops: list[ir.For] = []  # the loops around the statement being rewritten
        self.defs: dict[str, ir.Expr] = {}  # what each declaration met so far holds

    def fresh(self, name: str) -> str:
        return fresh_name(name, self.taken)

    def ahead(self, name: str) -> ir.Expr | None:
        """What the declaration ``name`` holds at the next step of the one enclosing
        serial loop it reads (at the loop's last step, its own value): ``k_blk`` of the
        next block of a block row, whose panel a tile can prefetch while this block runs.
        None unless ``name`` reads that loop's variable and the function's parameters
        alone, loads nothing the kernel writes, and the loop's body does not move its
        end (the next step read must be one the loop could take)."""
        init = self.defs.get(name)
        if init is None:
            return None
        loops = [f for f in self.loops if f.var.name in names(init)]
        if len(loops) != 1 or loops[0].parallel or names(init) - {loops[0].var.name} - self.params:
            return None
        if any(
            isinstance(n, ir.Load) and (n.array.output or n.array.name not in self.params)
            for n in nodes(init)
        ):
            return None
        (loop,) = loops
        if names(loop.end) & (assigned(loop.body) | {loop.var.name}):
            return None  # an end the loop moves: its next step is not known here
        last = ir.sub(loop.end, Const(1, I64))
        step = ir.Bin("min", ir.add(loop.var, Const(1, I64)), last)
        return substitute(init, {loop.var.name: step})

    def across(self, name: str) -> ir.Expr | None:
        """What ``name`` holds at the next step of the loop ``ahead`` finds, where that
        loop's steps for consecutive steps of the loop around it are consecutive (its
        start at the next outer step is its end: a block row's blocks, ``pA1`` from
        ``pos[i]`` to ``pos[i + 1]``): at a row's last block, the next row's first (at
        the very last, its own). None where ``ahead`` is, or the ranges are not so."""
        found = self._consecutive(name)
        if found is None:
            return None
        loop, outer, start, end = found
        last = substitute(end, {outer.var.name: ir.sub(outer.end, Const(1, I64))})
        step = ir.Bin("min", ir.add(loop.var, Const(1, I64)), ir.sub(last, Const(1, I64)))
        return substitute(self.defs[name], {loop.var.name: step})

    def stored(self, name: str) -> ir.Expr | None:
        """The steps the loop ``across`` walks take over all steps of the loop around it,
        as an expression of the function's parameters: the blocks stored in all block
        rows, ``pos[n - 1 + 1] - pos[0]`` for ``pA1`` from ``pos[i]`` to ``pos[i + 1]``
        and ``i`` from 0 to ``n``. None where ``across`` is, or the outer loop's start
        is not known from the parameters."""
        found = self._consecutive(name)
        if found is None:
            return None
        _, outer, start, end = found
        if names(outer.start) - self.params:
            return None
        v = outer.var.name
        return ir.sub(
            substitute(end, {v: ir.sub(outer.end, Const(1, I64))}),
            substitute(start, {v: outer.start}),
        )

    def _consecutive(self, name: str) -> tuple[ir.For, ir.For, ir.Expr, ir.Expr] | None:
        """For ``across``: the loop ``ahead`` finds, the loop around it, and its start and
        end in that loop's variable and the parameters; None unless its ranges follow
        each other from one outer step to the next."""
        if self.ahead(name) is None:
            return None
        init = self.defs[name]
        loop = next(f for f in self.loops if f.var.name in names(init))
        at = self.loops.index(loop)
        if at == 0:
            return None
        outer = self.loops[at - 1]
        v = outer.var.name
        end, start = loop.end, loop.start
        for _ in range(4):  # the declarations between the loops, resolved
            local = {n: self.defs[n] for n in names([end, start]) if n in self.defs}
            end, start = substitute(end, local), substitute(start, local)
        if names([end, start]) - {v} - self.params or names(outer.end) - self.params:
            return None
        if substitute(start, {v: ir.add(outer.var, Const(1, I64))}) != end:
            return None
        return loop, outer, start, end

    def allocs(self) -> list[ir.Stmt]:
        return [
            ir.Alloc(p, n, p.name not in self.unzeroed, huge=p.name in self.unzeroed)
            for p, n in zip(self.panels, self.sizes, strict=True)
        ]

    def frees(self) -> list[ir.Stmt]:
        return [ir.Free(p) for p in self.panels]

    def in_team(self) -> bool:
        """Whether the statement being rewritten runs inside a parallel loop of threads."""
        return any(f.parallel == "CPUThread" for f in self.loops)

    def team_allocs(self) -> list[ir.Stmt]:
        return [
            ir.Alloc(p, n, p.name not in self.unzeroed, huge=p.name in self.unzeroed)
            for p, n in self.team
        ]

    def allocated(self, body: list[ir.Stmt]) -> list[ir.Stmt]:
        """``body`` with the panels of nests outside parallel loops allocated around it."""
        return [*self.allocs(), *body, *self.frees()]
