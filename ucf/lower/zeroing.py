"""Dense outputs that the kernel zeroes itself, a slice at a time, where it computes them.

An ``=`` statement into a dense output starts from zeros. Loops over sparse operands
visit only nonzeros, and schedules that move an output loop inside a reduction add
into the output (``C[i, k] += ...`` with ``k`` inside the loop over A's row ``j``).
Without this pass the caller zeroes the whole array before the call. For SpMM into a
12.8 MB C that is a separate serial pass of 1.7 ms on this machine, and the kernel
then reads the zeros back from memory. (calloc's free zero pages do not help: glibc
reuses freed heap memory, which it must clear.)

When the outer loops run over whole output variables, and each visits every
coordinate of its variable, those loops fix a contiguous slice of the output: a row
of C for ``i``. This pass zeroes that slice at the top of the innermost such loop. The
zeros go into the cache that the compute then adds to, on the same thread, and the
caller need not zero at all (``Plan.writes_all``).
"""

from __future__ import annotations

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import loops, statements
from ucf.schedule.provenance import Provenance


def zero_slices(
    body: list[ir.Stmt],
    full: set[str],
    provenance: Provenance | None,
    level_vars: list[str],
    vals: ir.Array,
    level_dims: list[ir.Expr],
) -> tuple[str, ...]:
    """Zero the output's slices in ``body``, in place (as the loop transformations
    rewrite a nest), and return the output variables that fix a slice, outermost
    storage level first; ``()``, and ``body`` unchanged, when the loops do not cover
    the output.

    ``full`` holds the output variables whose loops the lowerer built over every
    coordinate; ``level_vars`` and ``level_dims`` are the output's variables and
    sizes in storage order.
    """
    pieces: dict[str, set[str]] = {}
    for _, loop in loops(body):
        v = _whole(loop.label, full, provenance) if isinstance(loop, ir.For) else None
        pieces.setdefault(v or "", set()).add(loop.label)
    found: tuple[ir.For, int, tuple[str, ...]] | None = None
    on_path: set[str] = set()
    bound: set[str] = set()  # the output variables of the loops on the way down
    visible: set[str] = set()  # loop variables and leading declarations on the way down
    block = body
    while True:
        nested = [s for s in block if any(_is_loop(x) for x in statements([s]))]
        if len(nested) != 1 or not isinstance(nested[0], ir.For):
            break
        loop = nested[0]
        v = _whole(loop.label, full, provenance)
        if v is None or loop.start != Const(0, I64) or not _clipped(loop, provenance):
            break
        on_path.add(loop.label)
        bound.add(v)
        visible.add(loop.var.name)
        at = 0
        while at < len(loop.body) and isinstance(loop.body[at], ir.Decl):
            visible.add(loop.body[at].var.name)
            at += 1
        fixed = tuple(level_vars[: len(bound)])
        if set(fixed) == bound <= visible and all(pieces[u] <= on_path for u in bound):
            found = (loop, at, fixed)
        block = loop.body
    if found is None:
        return ()
    loop, at, fixed = found
    base: ir.Expr = Const(0, I64)
    for lvl, v in enumerate(fixed):
        base = ir.add(ir.mul(base, level_dims[lvl]), Var(v, I64))
    span: ir.Expr = Const(1, I64)
    for d in level_dims[len(fixed) :]:
        span = ir.mul(span, d)
    zero = Const(0, vals.elem)
    if span == Const(1, I64):  # every output variable fixed: one element
        loop.body.insert(at, ir.Store(vals, base, zero))
    else:
        q = Var(f"{vals.name}_z", I64)
        store = ir.Store(vals, ir.add(ir.mul(base, span), q), zero)
        loop.body.insert(at, ir.For(q, Const(0, I64), span, [store]))
    return fixed


def _is_loop(s: ir.Stmt) -> bool:
    return isinstance(s, ir.For | ir.While)


def _clipped(loop: ir.For, provenance: Provenance | None) -> bool:
    """Whether the loop stops at its variable's extent. The inner loop of a split is
    clipped to the range (``min(chunk, hi - base)``) unless it was split again: then it
    runs whole blocks, and a guard deeper down skips the tail (``transforms._unclip``),
    so no piece of it, at any depth, may be taken as clipped."""
    rel = provenance.rel.get(loop.label) if provenance is not None else None
    if rel is None:
        return True
    if rel.role == "inner" and not (isinstance(loop.end, ir.Bin) and loop.end.op == "min"):
        return False
    while rel is not None:
        parent = rel.parents[0]
        rel = provenance.rel.get(parent)
        if rel is not None and rel.role == "inner":
            return False
    return True


def _whole(label: str, full: set[str], provenance: Provenance | None) -> str | None:
    """The output variable a loop visits every coordinate of, with the other pieces of
    its splits, or None: a label made only by ``split`` and ``divide`` of a variable in
    ``full`` (a ``bound`` or ``fuse`` may stop short of, or mix, whole variables)."""
    rel = provenance.rel.get(label) if provenance is not None else None
    if rel is None:
        return label if label in full else None
    if rel.kind not in ("split", "divide") or len(rel.parents) != 1:
        return None
    return _whole(rel.parents[0], full, provenance)
