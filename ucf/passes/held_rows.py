"""An output row held in registers across the loop that adds into it, for the CPU targets.

SpMM's ``i, j, k`` (and the gradient of an SDDMM's C, ``grad_C(i,k) += grad_A(i,j) *
D(k,j) * B(i,j)``) runs a bounded loop over the output's row ``k`` inside the loop over
the stored entries of row ``i``: every entry loads the row of the output, adds to it and
stores it back. The row does not move while the entries are walked, but a compiler
keeps it in memory: over a co-iteration (``while`` over two sparse rows, the store under
an ``if``) it cannot show the store happens, and over a plain loop the unrolled constant
trip count reaches the vectorizer as one wide load, multiply-add and store per entry.
Each entry then waits for the last one's store to be forwarded to its load: on a Zen 4
(AVX-512, whose 512-bit stores are two 256-bit halves) the gradient of C at K = 8 ran at
about 9 ns an entry, 2-2.3x the loop without its bound, which the vectorizer cut into
two 256-bit chains.

This pass finds a loop of constant trip count ``n`` whose body adds lane by lane into
``out[base + k]`` (``tiling.accumulation``), inside a loop (``for`` or ``while``, the
store under ``if``\\ s only) across which ``base`` stays the same and which reads or
writes ``out`` nowhere else. The row is loaded into vectors before that loop (zeros,
where the slice's zeroing loop comes right before it), the loop adds into them (the
factors that do not vary with ``k`` broadcast), and they are stored after it. Each
element still sums its terms in the same order, each a fused multiply-add as
``ucf.passes.fma`` makes them, so the result is bit for bit the original's.

The vectors are ``tiling.tile_bytes`` wide, halved until they divide ``n``; the row is
held in scalars at an odd ``n``, or where the value is not lane by lane over ``k`` (a
row-major operand read down a column). The row takes at most half the vector registers
(16 of AVX-512's 32, 8 of AVX2's 16): a longer row stays as it was. The output's
buffer is distinct from every operand's (the kernels' pointers are ``noalias``), so no
load of an operand can see the row's stores.
"""

from __future__ import annotations

from dataclasses import replace

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import assigned, declared, fresh_name, names, nodes, substitute, walk
from ucf.passes.tiling import (
    SIZES,
    WIDE_BYTES,
    accumulation,
    enabled,
    lanewise,
    serial_loop,
    tile_bytes,
    trip_count,
    unit_offset,
    vector_of,
)


def hold_rows(fn: ir.Function) -> tuple[ir.Function, list[str]]:
    """``fn`` with each row of the shape above held in registers, and a line per row
    held (for ``k.cin``); ``fn`` as it is where ``UCF_REGISTER_BLOCKING=0``
    (``tiling.enabled``) turns the register passes off."""
    if not enabled():
        return fn, []
    taken = declared(fn.body) | {p.name for p in fn.params}
    notes: list[str] = []
    body = _block(fn.body, taken, notes)
    return (fn, []) if not notes else (replace(fn, body=body), notes)


def _block(stmts: list[ir.Stmt], taken: set[str], notes: list[str]) -> list[ir.Stmt]:
    out: list[ir.Stmt] = []
    for at, s in enumerate(stmts):
        held = _held(s, stmts[:at], taken, notes) if _reduction(s) else None
        if held is not None:
            out += held
        elif s.BLOCKS:
            out.append(replace(s, **{b: _block(getattr(s, b), taken, notes) for b in s.BLOCKS}))
        else:
            out.append(s)
    return out


def _reduction(s: ir.Stmt) -> bool:
    """Whether ``s`` is a loop one thread runs step after step."""
    return isinstance(s, ir.While) or (isinstance(s, ir.For) and serial_loop(s))


def _held(
    loop: ir.For | ir.While, before: list[ir.Stmt], taken: set[str], notes: list[str]
) -> list[ir.Stmt] | None:
    """``loop`` with the row its inner loop adds into held in registers, with the loads
    before and the stores after it; None if it is not of the shape above."""
    inner = [(s, path) for s, path in walk(loop.body) if isinstance(s, ir.For | ir.While)]
    if len(inner) != 1 or not isinstance(inner[0][0], ir.For):
        return None
    row, path = inner[0]
    n = trip_count(row)
    found = accumulation(row)
    if n is None or found is None or not all(isinstance(p, ir.If) for p in path):
        return None
    store, base = found
    changed = declared(loop.body) | assigned(loop.body)
    if isinstance(loop, ir.For):
        changed.add(loop.var.name)
    if names(base) & changed or _accesses([loop], store.array.name) != 1:
        return None
    elem = store.array.elem
    lanes = tile_bytes(elem) // SIZES[elem] if lanewise(store.value, row.var.name, "") else 1
    while n % lanes:
        lanes //= 2
    registers = 32 if tile_bytes(elem) == WIDE_BYTES else 16
    if n // lanes > registers // 2:
        return None
    start = ir.add(base, row.start)
    places = [ir.add(start, Const(v * lanes, I64)) for v in range(n // lanes)]
    typ = elem if lanes == 1 else ir.vector(elem, lanes)
    acc = [Var(fresh_name("row", taken), typ) for _ in places]
    zeroed = _zeroed(before, store.array.name, base, row)
    if zeroed:
        first = [Const(0.0 if elem in ir.FLOAT_TYPES else 0, elem)] * len(places)
        if lanes > 1:
            first = [ir.Splat(z, lanes) for z in first]
    elif lanes == 1:
        first = [ir.Load(store.array, p) for p in places]
    else:
        first = [ir.VLoad(store.array, p, lanes) for p in places]
    k = row.var.name
    decls: list[ir.Stmt] = []
    leaves: dict[ir.Expr, Var] = {}

    def leaf(e: ir.Expr) -> Var:
        """``e`` declared once per step of ``loop`` (the factors of every vector)."""
        if e not in leaves:
            name = "s" if ir.lanes(e.type) == 1 else "v"
            leaves[e] = Var(fresh_name(name, taken), e.type)
            decls.append(ir.Decl(leaves[e], e))
        return leaves[e]

    updates: list[ir.Stmt] = []
    for v, a in enumerate(acc):
        if lanes == 1:
            term = substitute(store.value, {k: ir.add(row.start, Const(v, I64))})
        else:
            term = vector_of(store.value, k, row.start, v * lanes, lanes, leaf, {})
        updates.append(ir.Assign(a, ir.add_product(a, term)))
    body = _replaced(loop.body, row, [*decls, *updates])
    held: list[ir.Stmt] = [
        *(ir.Decl(a, f) for a, f in zip(acc, first, strict=True)),
        replace(loop, body=body),
        *(ir.Store(store.array, p, a) for p, a in zip(places, acc, strict=True)),
    ]
    if not zeroed:  # the row loaded and stored only where the loop runs, as the nest wrote it
        entered = loop.cond if isinstance(loop, ir.While) else ir.Cmp("<", loop.start, loop.end)
        held = [ir.If(entered, held)]
    label = row.label or k
    over = loop.label or (loop.var.name if isinstance(loop, ir.For) else "its loop")
    notes.append(
        f"registers: {store.array.name.removesuffix('_vals')}'s row ({label}, {n} values) "
        f"is held in {len(acc)} register{'s' * (len(acc) > 1)} across {over}"
    )
    return held


def _accesses(stmts: list[ir.Stmt], array: str) -> int:
    """How many loads and stores of ``array`` the statements hold; 2 where they call a
    function, which may reach any array."""
    count = 0
    for n in nodes(stmts):
        if isinstance(n, ir.Call):
            return 2
        if isinstance(n, ir.Load | ir.VLoad | ir.Store | ir.FetchAdd | ir.Prefetch):
            count += n.array.name == array
    return count


def _zeroed(before: list[ir.Stmt], array: str, base: ir.Expr, row: ir.For) -> bool:
    """Whether the last statement of ``before`` other than declarations is a loop from 0
    storing zeros at ``base`` on in ``array`` (``ucf.lower.zeroing``'s slice) as far as
    ``row`` adds (``_covers``): the row then starts from zeros, and exists."""
    rest = [s for s in before if not isinstance(s, ir.Decl | ir.Comment)]
    if not rest or not isinstance(rest[-1], ir.For) or not serial_loop(rest[-1]):
        return False
    z = rest[-1]
    if z.start != Const(0, I64) or len(z.body) != 1 or not isinstance(z.body[0], ir.Store):
        return False
    put = z.body[0]
    return (
        put.array.name == array
        and not put.accumulate
        and isinstance(put.value, Const)
        and put.value.value == 0
        and unit_offset(put.index, z.var.name) == base
        and _covers(z.end, base, row)
    )


def _covers(end: ir.Expr, base: ir.Expr, row: ir.For) -> bool:
    """Whether zeros stored from ``base`` to ``base + end`` reach every place ``base + k``
    the row loop (of constant bounds) adds into: ``end`` is a constant no less than the
    loop's end, or ``base`` is a multiple of ``end`` (``i * C_dim1``, zeros to
    ``C_dim1``), so that the zeros fill slice ``i`` of slices ``end`` apart, which the
    row loop, adding into its own slice, stays in (``bound(k, kb, 8, MaxExact)``'s
    loop of 8 in a row of ``C_dim1``, which each call checks is 8). A zeroing that
    stopped short would leave the rest of the row as it was, which the row held from
    zeros would overwrite."""
    if isinstance(base, ir.Bin) and base.op == "*" and end in (base.left, base.right):
        return True
    return isinstance(end, Const) and row.start.value >= 0 and row.end.value <= end.value


def _replaced(stmts: list[ir.Stmt], row: ir.For, by: list[ir.Stmt]) -> list[ir.Stmt]:
    """``stmts`` with the loop ``row`` (found through ``if``\\ s) replaced by ``by``."""
    out: list[ir.Stmt] = []
    for s in stmts:
        if s is row:
            out += by
        elif isinstance(s, ir.If):
            out.append(
                replace(s, then=_replaced(s.then, row, by), orelse=_replaced(s.orelse, row, by))
            )
        else:
            out.append(s)
    return out
