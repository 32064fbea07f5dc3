"""The parallel plan of a one-pass output: rows in chunks balanced by the bound, each
chunk appending into its own bounded region of the output's arrays, the regions then
moved together.

A one-pass output (a sparse add's, a Gustavson product's: ``AssemblyMixin._bound_operands``,
``ucf.lower.product_bound``) is allocated at a bound of its entries and its rows are
appended one after the other. Rows built in parallel used to need each row's count
first, a second pass over the work: a sparse add on two threads then did twice the
work of one and ran slower than the one-thread plan (issue 38: 20.9 against 16.3 ms),
and SpGEMM gained nothing from its second thread (83.7 against 87.7 ms).

Where ``prefix(r)`` bounds the entries of the rows before ``r`` (the operands' entries
there, or the products of those rows), the rows from ``r`` on may start writing at
``prefix(r)``: no row of an earlier chunk reaches it. So the rows are cut into
``CHUNKS`` chunks of about equal bound (a binary search for each cut), each thread
takes one block of them (schedule kind ``blocks``), and each chunk appends its rows
into the output from ``prefix`` of its first row, exactly as the one-thread plan
appends them (each row is built by the same code, so the results are bit for bit the
one-thread plan's). A thread that takes the next chunk after its last one goes on
where it stopped, so a team of one leaves no gap at all, and a thread that finds the
next block still there (its owner started late) takes it with no gap either. Then
every chunk that starts past the end of the one before is moved down and its rows'
positions shifted, the chunks in parallel in dynamic pieces (``_moved``): on two
threads the second block, about half the output. (The llvm target's static loops
used to hand the chunks out four pieces a thread, and about 7/8 of the output moved;
with it the parallel plan ran about 7 % more instructions than the serial plan, for
a sparse add and SpGEMM alike, bench/README.md, where counting the rows first cost
135 % and 18 %.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ucf.format.format import Format
from ucf.format.levels import LevelKind
from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Array, Const, Var
from ucf.ir.walk import substitute
from ucf.schedule import Applied, Command, Parallel
from ucf.schedule.loops import Arrange, SplitCommand


@dataclass(frozen=True)
class OnePass:
    """The bound of a one-pass output, one object for a sum's and a product's: what
    ``k.cin`` says of its arrays (``note``), the assemble pass that writes the bound
    into the counts (``assemble``, documented by ``doc``), and for rows in parallel
    ``prefix(r)``, the bound of the rows before ``r``, once ``prelude(loop)`` ran.
    ``emptied``: the compute pass empties every segment before the rows close theirs
    (a product's, as on main: without it the serial SpGEMM's kernel ran 2.7 % more
    instructions, 373.6M against 363.8M a call by callgrind, for reasons not found;
    a sum's opens the first segment only)."""

    note: str
    doc: str
    assemble: Callable[[], list[ir.Stmt]]
    prefix: Callable[[ir.Expr], ir.Expr]
    prelude: Callable[[ir.For], list[ir.Stmt]]
    emptied: bool = False


#: The chunks the rows are cut into: enough for the threads of a large machine to take
#: several each (the llvm target hands a static loop out in a few pieces per thread).
CHUNKS = 256
#: The chunks a thread takes at a time when they are moved: the chunks that move are the
#: later threads' (a static share would give the first thread none of them).
MOVED_PIECE = 8
#: What ``k.cin`` adds to the note of a one-pass output whose rows run in parallel.
NOTE = (
    f"; its rows run in parallel in {CHUNKS} chunks of about equal bound (whatever blocks "
    "the schedule shared them out in), each appending into a region of its own, the "
    "regions moved together at the end"
)


def shares_rows(applied: Applied | None, out_vars: list[str | None], out_fmt: Format) -> bool:
    """Whether a schedule's parallel loops leave a one-pass output possible: none, or
    only the output's row variable (of a dense level above a compressed one) on CPU
    threads, outermost, itself or the outer loop of a split of it into blocks (as the
    default shares skewed rows out). The chunks then replace how the schedule shared
    the rows out (``unsplit``)."""
    if applied is None or not applied.parallel:
        return True
    if out_fmt.order != 2:
        return False
    return unsplit(applied, out_vars[0]) is not None


def unsplit(applied: Applied, row: str) -> tuple[list[Command], dict[str, Parallel]] | None:
    """The steps and parallel loops of a schedule that shares out ``row``, with its rows
    on CPU threads unsplit (the chunks balance them by their bound); None where it
    shares out something else, or also transforms the split's loops."""
    if len(applied.parallel) != 1:
        return None
    ((label, par),) = applied.parallel.items()
    if par.unit != "CPUThread" or not applied.loops or applied.loops[0] != label:
        return None
    if label == row:
        return list(applied.steps), {row: par}
    splits = [c for c in applied.steps if isinstance(c, SplitCommand) and c.outer == label]
    if len(splits) != 1 or splits[0].var != row or applied.loops[1] != splits[0].inner:
        return None
    inner = splits[0].inner
    rest: list[Command] = []
    for c in applied.steps:
        if isinstance(c, Arrange):  # the final order, the split's loops as the row's
            c = Arrange(tuple(row if v == label else v for v in c.order if v != inner))
        elif {label, inner} & set(getattr(c, "variables", ())):
            if c is not splits[0]:
                return None
            continue
        rest.append(c)
    return rest, {row: par}


def rewrite(
    body: list[ir.Stmt],
    row: str,
    counter: Var,
    bound: OnePass,
    level: tuple[LevelKind, dict, str],
    vals: Array,
) -> list[ir.Stmt]:
    """``body``, a one-pass compute function's, with its parallel loop over ``row`` run in
    chunks (module docstring). ``counter`` is the output level's size that the rows
    append at; ``bound.prefix(r)`` bounds the entries of the rows before ``r`` once
    ``bound.prelude(loop)`` ran (given the row loop, whose threads it may share);
    ``level`` is the output's compressed level (its kind, arrays and index type) and
    ``vals`` its values. A body without such a loop is returned as it is."""
    at = next(
        (
            k
            for k, s in enumerate(body)
            if isinstance(s, ir.For) and s.var.name == row and s.parallel == "CPUThread"
        ),
        None,
    )
    if at is None:
        return body
    loop = body[at]
    assert isinstance(loop, ir.For)
    prefix = bound.prefix
    n = loop.end
    rows, first, end, starts = (
        Array(f"chunk_{x}", I64, True) for x in ("rows", "first", "end", "starts")
    )
    c, cnt, last = Var("chunk", I64), Var("chunk_at", I64), Var("chunk_last", I64)
    one = Const(1, I64)
    chunk = ir.For(
        c,
        Const(0, I64),
        Const(CHUNKS, I64),
        [
            ir.If(
                ir.Cmp("!=", c, ir.add(last, one)),
                [ir.Assign(cnt, ir.Load(starts, c))],
            ),
            ir.Store(first, c, cnt),
            ir.For(
                loop.var,
                ir.Load(rows, c),
                ir.Load(rows, ir.add(c, one)),
                substitute(loop.body, {counter.name: cnt}),
                label=loop.label,
            ),
            ir.Store(end, c, cnt),
            ir.Assign(last, c),
        ],
        parallel=loop.parallel,
        label=loop.label,
        strategy=loop.strategy,
        schedule=("blocks", 0),
        prologue=[*loop.prologue, ir.Decl(last, Const(-2, I64)), ir.Decl(cnt, Const(0, I64))],
        epilogue=loop.epilogue,
        parallel_if=loop.parallel_if,
    )
    return [
        *body[:at],
        *bound.prelude(loop),
        ir.Alloc(rows, Const(CHUNKS + 1, I64), zeroed=False),
        ir.Alloc(first, Const(CHUNKS, I64), zeroed=False),
        ir.Alloc(end, Const(CHUNKS, I64), zeroed=False),
        ir.Alloc(starts, Const(CHUNKS, I64), zeroed=False),
        *_cuts(rows, starts, n, prefix),
        chunk,
        *_moved(rows, first, end, counter, level, vals, loop),
        ir.Free(rows),
        ir.Free(first),
        ir.Free(end),
        ir.Free(starts),
        *body[at + 1 :],
    ]


def _cuts(
    rows: Array, starts: Array, n: ir.Expr, prefix: Callable[[ir.Expr], ir.Expr]
) -> list[ir.Stmt]:
    """``rows[c]``: the first row whose prefix reaches ``c / CHUNKS`` of the whole bound
    (a binary search; the prefix never falls), and ``rows[CHUNKS]`` the end;
    ``starts[c]``: the prefix of ``rows[c]``, where chunk ``c`` starts writing. Read
    here, before the chunks run: a product's prefix is the output's own positions,
    which the last row of chunk ``c - 1`` overwrites while chunk ``c`` would read them
    (a data race, harmless in value but undefined behaviour)."""
    c, lo, hi, mid, goal = (Var(f"cut_{x}", I64) for x in ("c", "lo", "hi", "mid", "goal"))
    total = Var("cut_total", I64)
    one = Const(1, I64)
    search = [
        ir.Decl(goal, ir.Bin("/", ir.mul(total, c), Const(CHUNKS, I64))),
        ir.Decl(lo, Const(0, I64)),
        ir.Decl(hi, n),
        ir.While(
            ir.Cmp("<", lo, hi),
            [
                ir.Decl(mid, ir.Bin(">>", ir.add(lo, hi), one)),
                ir.If(
                    ir.Cmp("<", prefix(mid), goal),
                    [ir.Assign(lo, ir.add(mid, one))],
                    [ir.Assign(hi, mid)],
                ),
            ],
        ),
        ir.Store(rows, c, lo),
    ]
    return [
        ir.Decl(total, prefix(n)),
        ir.For(c, Const(0, I64), Const(CHUNKS, I64), search),
        ir.Store(rows, Const(CHUNKS, I64), n),
        ir.For(
            c, Const(0, I64), Const(CHUNKS, I64), [ir.Store(starts, c, prefix(ir.Load(rows, c)))]
        ),
    ]


def _moved(
    rows: Array,
    first: Array,
    end: Array,
    counter: Var,
    level: tuple[LevelKind, dict, str],
    vals: Array,
    loop: ir.For,
) -> list[ir.Stmt]:
    """Each chunk moved down to where the one before it ended, its rows' positions
    shifted with it, on the threads of ``loop``; ``counter`` ends as the output's
    entries.

    A chunk moved down by ``shift`` lands partly on the source of the chunks before it
    (the tail of the previous chunk's entries, where the shift exceeds the gap before
    it), so the chunks cannot simply move at once. Each first sets its first
    ``min(shift, entries)`` entries aside in a stash and moves the rest down within
    its own source (a forward copy); then, once every chunk has, each writes its stash
    to its destination's start: every read of a source comes before any write that
    leaves a chunk's own. The stash holds about the gaps' worth of entries where the
    bound is close (a sum, a product of rows that rarely meet), up to the output where
    it is far."""
    kind, arrays, it = level
    shifts, stashes = (Array(f"move_{x}", I64, True) for x in ("shift", "stash"))
    crd_aside, vals_aside = Array("aside_crd", it, True), Array("aside_vals", vals.elem, True)
    one, zero = Const(1, I64), Const(0, I64)
    at, aside = Var("move_at", I64), Var("move_aside", I64)
    c, start, got = Var("move_c", I64), Var("move_start", I64), Var("move_got", I64)
    plan = [
        ir.Decl(start, ir.Load(first, c)),
        ir.Decl(got, ir.sub(ir.Load(end, c), start)),
        ir.Store(shifts, c, ir.sub(start, at)),
        ir.Store(stashes, c, aside),
        ir.Assign(aside, ir.add(aside, ir.minimum(ir.sub(start, at), got))),
        ir.Assign(at, ir.add(at, got)),
    ]

    def each(tag: str, work) -> ir.For:
        """A parallel loop over the chunks that moved: ``work(c, start, shift, kept,
        entries, stash)``, ``kept`` of the chunk's entries set aside from ``stash`` on."""
        k, sh, st = Var(f"{tag}_c", I64), Var(f"{tag}_shift", I64), Var(f"{tag}_start", I64)
        kept, got, at = Var(f"{tag}_kept", I64), Var(f"{tag}_got", I64), Var(f"{tag}_at", I64)
        body = [
            ir.Decl(st, ir.Load(first, k)),
            ir.Decl(got, ir.sub(ir.Load(end, k), st)),
            ir.Decl(kept, ir.minimum(sh, got)),
            ir.Decl(at, ir.Load(stashes, k)),
            *work(k, st, sh, kept, got, at),
        ]
        return ir.For(
            k,
            zero,
            Const(CHUNKS, I64),
            [ir.Decl(sh, ir.Load(shifts, k)), ir.If(ir.Cmp(">", sh, zero), body)],
            parallel=loop.parallel,
            strategy=loop.strategy,
            schedule=("dynamic", MOVED_PIECE),
            parallel_if=loop.parallel_if,
        )

    def copy(to: ir.Expr, source: ir.Expr, into: bool = False, out_of: bool = False):
        """An entry copied within the output, into the stash or out of it."""
        crd = ir.Load(crd_aside, source) if out_of else kind.coordinate(arrays, source)
        value = ir.Load(vals_aside if out_of else vals, source)
        if into:
            return [ir.Store(crd_aside, to, crd), ir.Store(vals_aside, to, value)]
        return [*kind.append(arrays, to, crd, it), ir.Store(vals, to, value)]

    def set_aside(k, st, sh, kept, got, at):
        p, r = Var("aside_p", I64), Var("aside_r", I64)
        row_end = ir.cast(kind.bounds(arrays, r, None, None)[1], I64)
        return [
            ir.For(p, zero, kept, copy(ir.add(at, p), ir.add(st, p), into=True)),
            ir.For(p, kept, got, copy(ir.sub(ir.add(st, p), sh), ir.add(st, p))),
            ir.For(
                r,
                ir.Load(rows, k),
                ir.Load(rows, ir.add(k, one)),
                kind.close(arrays, r, ir.sub(row_end, sh), it),
            ),
        ]

    def put_back(k, st, sh, kept, got, at):
        p = Var("back_p", I64)
        return [ir.For(p, zero, kept, copy(ir.add(ir.sub(st, sh), p), ir.add(at, p), out_of=True))]

    room = ir.Bin("max", aside, one)
    return [
        ir.Alloc(shifts, Const(CHUNKS, I64), zeroed=False),
        ir.Alloc(stashes, Const(CHUNKS, I64), zeroed=False),
        ir.Decl(at, zero),
        ir.Decl(aside, zero),
        ir.For(c, zero, Const(CHUNKS, I64), plan),
        ir.Alloc(crd_aside, room, zeroed=False),
        ir.Alloc(vals_aside, room, zeroed=False),
        each("aside", set_aside),
        each("back", put_back),
        ir.Free(crd_aside),
        ir.Free(vals_aside),
        ir.Free(shifts),
        ir.Free(stashes),
        ir.Assign(counter, at),
    ]
