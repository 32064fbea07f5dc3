"""Prefetch the position streams of consecutive rows well ahead (issue 38, SpMV).

A loop over rows that walks each row's positions (CSR SpMV: ``A_vals[p]`` and
``A1_crd[p]`` for ``p`` in ``pos[i] .. pos[i+1]``) reads those two arrays straight
through, row after row. With the hardware's stream prefetcher alone, uniform SpMV
(200k rows of 10, x of 1.6 MB read at random) took 2.6 ms on one thread, where the
same arrays with x in L1 take 0.9: the gathers of x waited behind the streams. Here
each row's walk asks first for the line ``DISTANCE`` bytes ahead in each stream, and
a row split into partial sums (``ucf.passes.partial_sums``) asks again at every block
of its terms. llvm, one thread, process CPU time, load 6.5, in one process with the
pass off and on (``UCF_STREAM_PREFETCH``): uniform 2.60 -> 1.64 ms, R-MAT 24.0 ->
21.8, banded 11.67 -> 11.82 (its rows of 15 run a few more instructions each, and
its x is read in order). Prefetching the coordinates alone lost 20 % on banded;
both streams the same bytes ahead, or more, cost it 1 to 2 %.

Only innermost walks are fetched, whose steps do little besides reading the streams
(SpMV's, TTV's over ``k``): a walk whose steps run a loop (SpMM's over the columns,
SpGEMM's over B's row, SDDMM's over ``k``) spends its time there. Only streams that
continue across rows are fetched: the loop's start is a ``pos``
load at a position that steps by one with an enclosing loop (the row), and the
arrays fetched are those the loop loads at its own position (a row of B that SpGEMM
walks at A's coordinate is not such a stream; ``ucf.passes.prefetch`` handles it).
The lines go into every cache level (``prefetcht0``), or into the L2 and beyond for a
loop the ``streams(j, 2)`` command names (``prefetcht1``): where the reads of ``x``
miss the L1 and L2 (the uniform matrix above, on a Zen 4 core), the L1 prefetches cost
more than they save, and the default gives such walks level 2
(``ucf.schedule.far_streams``). The values computed are unchanged: a prefetch only
moves a line. A walk fetched into the L1 also starts a line of code (``LINE``), unless it
streams coordinates only (``_aligns``). A prefetch never
faults, and its address is computed without assuming it lies in the array
(``ir.Prefetch``), so the rows near the end fetch past it harmlessly.
"""

from __future__ import annotations

import os
from dataclasses import replace

from ucf.errors import UcfError
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import names, nodes, statements, substitute
from ucf.passes.tiling import serial_loop

#: Bytes between a stream's read and its prefetch (768 float64 values, 1536 int32
#: coordinates). llvm, on uniform / banded / R-MAT, of the time without (a Zen 5 core,
#: 48 KB of L1, process CPU time, load 7): 2 KB ahead 0.63 / 1.18 / 0.98; 4 KB 0.58 /
#: 1.02 / 0.91; 8 KB 0.63 / 1.01 / 0.91. On a Zen 4 core (32 KB of L1), banded's
#: loop aligned (``LINE``), one thread: 4 KB 0.93, 5 KB 0.90, 6 KB 0.89-0.90, 16 KB
#: 1.2 of 8 KB's time; two threads 6 KB 0.91; uniform and R-MAT alike within the noise
#: (bench/README.md, "Where banded SpMV's row loop lies").
DISTANCE = 6144
#: The bytes a walk whose streams go into the L1 is aligned to (``ir.For.align``): a
#: line of code. Such a walk's reads of ``x`` hit the cache, so its loop runs as fast
#: as the core's front end delivers it, and LLVM places an innermost loop at 16 bytes:
#: banded SpMV's loop over a row (24 bytes) lay across two 64-byte lines, fetched
#: twice an iteration, 18.7-19.1 ms on one Zen 4 thread; the same assembly within a
#: line 15.8-16.1 (process CPU time, load 10, bench/README.md "Where banded SpMV's
#: row loop lies"). A walk whose streams go into the L2 (the uniform matrix's, whose
#: gathers miss the L1 and L2) keeps LLVM's placement: its loop inside a line ran
#: 1.07-1.13x the time of its loop across two (the cause, without hardware counters,
#: not found). 0 leaves every walk to LLVM's placement (bench/banded_spmv.py).
LINE = 64
#: The largest number of positions one step of a blocked loop covers for it to be
#: fetched in the loop (the partial sums' blocks of 4 float64, 8 float32).
MAX_BLOCK = 16


def enabled() -> bool:
    """Whether the pass runs: ``UCF_STREAM_PREFETCH=0`` leaves the streams to the
    hardware, to measure what the prefetches gain. The kernel cache keys on it."""
    text = os.environ.get("UCF_STREAM_PREFETCH", "1").strip()
    if text not in ("0", "1"):
        raise UcfError(f"UCF_STREAM_PREFETCH={text!r}: stream prefetches are 1 (on) or 0 (off)")
    return text == "1"


def prefetch_streams(
    fn: ir.Function, levels: dict[str, int] | None = None
) -> tuple[ir.Function, list[str]]:
    """``fn`` with the position streams of its row walks prefetched ``DISTANCE`` ahead,
    into the cache level ``levels`` gives a loop's label (the ``streams`` command),
    else 1, and a note per loop (for ``k.cin``)."""
    pos = {p.name for p in fn.params if p.is_array and p.role[:1] == ("pos",)}
    if not pos or not enabled():
        return fn, []
    crd = {p.name for p in fn.params if p.is_array and p.role[:1] == ("crd",)}
    notes: dict[str, None] = {}
    body = _block(fn.body, (pos, crd), {}, None, notes, levels or {})
    return replace(fn, body=body), list(notes)


def _aligns(arrays: list[str], crd: set[str], level: int) -> bool:
    """Whether a walk fetching ``arrays`` into cache ``level`` starts a line of code
    (``LINE``): a walk into the L1 that streams values, whose loop is its kernel's work
    (SpMV's, TTV's). A walk that streams only coordinates counts a sparse output's rows
    before the kernel fills them (SpGEMM's bound on two threads: the sum of B's row
    lengths over A's row) and keeps LLVM's placement: its loop is a small share of the
    kernel (1.0 ms of process CPU time, aligned or not, in a call of 140-170 on
    bench/peers.py's operand), and its 48 bytes of padding moved the fill loops compiled
    after it, which cost the sorted call 2-4 % (bench/README.md, "SpGEMM's count walk
    and the line of code")."""
    return level == 1 and LINE > 0 and not set(arrays) <= crd


def _block(
    stmts: list[ir.Stmt],
    arrays: tuple[set[str], set[str]],
    env: dict[str, ir.Expr],
    row: str | None,
    notes: dict[str, None],
    levels: dict[str, int],
) -> list[ir.Stmt]:
    """``stmts`` with their row walks prefetched; ``arrays``: the kernel's ``pos`` and
    ``crd`` arrays; ``env`` holds the values of the variables declared around them,
    ``row`` the variable of the innermost loop around them."""
    pos, crd = arrays
    out: list[ir.Stmt] = []
    env = dict(env)
    for s in stmts:
        if isinstance(s, ir.Decl):
            env[s.var.name] = substitute(s.init, env)
        if isinstance(s, ir.For):
            s = replace(s, body=_block(s.body, arrays, env, s.var.name, notes, levels))
            if serial_loop(s) and not any(
                isinstance(t, ir.For | ir.While) for t in statements(s.body)
            ):
                label = s.label or s.var.name
                level = levels.get(label, 1)
                fetch = _before(s, pos, env, row, level)
                out += fetch
                walked = _within(s, pos, env, row, level)
                fetched = [f.array.name for f in fetch] or [
                    f.array.name for f in walked.body if isinstance(f, ir.Prefetch)
                ]
                if fetched:
                    into = " into the L2" if level == 2 else ""
                    aligned = _aligns(fetched, crd, level)
                    line = f"; loop {label} starts a {LINE}-byte line of code" if aligned else ""
                    notes[
                        f"prefetch: {', '.join(fetched)} of loop {label} "
                        f"fetched {DISTANCE // 1024} KB ahead{into}, row after row{line}"
                    ] = None
                    if aligned:
                        walked = replace(walked, align=LINE)
                s = walked
        elif s.BLOCKS:
            s = replace(
                s, **{b: _block(getattr(s, b), arrays, env, row, notes, levels) for b in s.BLOCKS}
            )
        out.append(s)
    return out


def _streamed(loop: ir.For, at: str) -> list[ir.Array]:
    """The operand arrays ``loop``'s body loads at exactly the variable ``at``."""
    found = {
        n.array.name: n.array
        for n in nodes(loop.body)
        if isinstance(n, ir.Load) and n.index == Var(at, I64) and not n.array.output
    }
    return list(found.values())


def _starts_row(start: ir.Expr, pos: set[str], env: dict[str, ir.Expr], row: str | None) -> bool:
    """Whether ``start`` is a ``pos`` load at a place the loop right around the walk
    steps by one: the next row's positions then follow this row's (a loop further out
    stepping it, with others between, would fetch the same lines at each of their
    steps)."""
    start = substitute(start, env)
    while isinstance(start, ir.Cast):
        start = start.operand
    if not (isinstance(start, ir.Load) and start.array.name in pos):
        return False
    return row is not None and _steps_with(start.index, row)


def _steps_with(e: ir.Expr, var: str) -> bool:
    """``e`` is ``var`` plus terms that do not read it."""
    if e == Var(var, I64):
        return True
    if isinstance(e, ir.Bin) and e.op == "+":
        left, right = var in names(e.left), var in names(e.right)
        return (_steps_with(e.left, var) and not right) or (_steps_with(e.right, var) and not left)
    return False


def _before(
    loop: ir.For, pos: set[str], env: dict[str, ir.Expr], row: str | None, level: int
) -> list[ir.Stmt]:
    """A prefetch into cache ``level`` of each stream a row's position loop reads,
    ``DISTANCE`` past its start, once before the loop (a row of 10 reads about one line
    of each)."""
    if not _starts_row(loop.start, pos, env, row):
        return []
    streamed = _streamed(loop, loop.var.name)
    return [ir.Prefetch(a, _ahead(loop.start, a), level) for a in streamed]


def _ahead(at: ir.Expr, array: ir.Array) -> ir.Expr:
    """The position ``DISTANCE`` bytes of ``array`` past ``at``."""
    return ir.add(at, Const(DISTANCE // ir.ELEMENT_BYTES[array.elem], I64))


def _within(
    loop: ir.For, pos: set[str], env: dict[str, ir.Expr], row: str | None, level: int
) -> ir.For:
    """A blocked walk of a row's positions (``at = lo + b * c`` first in the body, ``lo``
    a row's start) with a prefetch into cache ``level`` of each stream at
    ``at + DISTANCE`` in every step."""
    first = loop.body[0] if loop.body else None
    if not isinstance(first, ir.Decl):
        return loop
    init = first.init
    b = loop.var.name
    if not (isinstance(init, ir.Bin) and init.op == "+"):
        return loop
    base, step = (init.left, init.right) if b in names(init.right) else (init.right, init.left)
    if b in names(base) or not (
        isinstance(step, ir.Bin)
        and step.op == "*"
        and Var(b, I64) in (step.left, step.right)
        and any(isinstance(c, Const) and 1 < c.value <= MAX_BLOCK for c in (step.left, step.right))
    ):
        return loop
    if not _starts_row(base, pos, env, row):
        return loop
    arrays = _streamed(loop, first.var.name)
    if not arrays:
        return loop
    fetch = [ir.Prefetch(a, _ahead(first.var, a), level) for a in arrays]
    return replace(loop, body=[first, *fetch, *loop.body[1:]])
