"""Short sums without a branch on their length: ``branchless(k, width)`` (issue 38, TTV).

TTV, ``A(i,j) = B(i,j,k) * c(k)`` over a CSF tensor, sums each fiber of ``k`` into a
scalar. On the peer run's tensor (2000 x 1000 x 1000, 5M entries) a fiber holds 2.7
entries on average, 1 to 9 of them, at random: the branch that ends the loop over a
fiber is mispredicted about once a fiber, and that, not memory, set the kernel's time
(TACO's generated C and ucf's alike, 13.7 ms on one thread). A loop of 4 steps
whatever the fiber's length, each step's sum kept only where the step lies in the
fiber (a select, no branch), ran the same walk in 7.0 ms (hand-written C, gcc -O3 with
a blend intrinsic; 3, 6 and 8 steps: 9.3, 6.5 and 8.1 ms).

This pass writes that form for a loop the schedule names (``branchless``, which the
default gives short fibers: ``ucf.schedule.short_fibers``) whose trip count comes
with the call and whose body is straight-line arithmetic summing into one float
scalar declared outside it: where the loop runs 1 to ``width`` times, its body runs
``width`` times at the positions ``min(start + q, end - 1)`` (each one the loop
itself reads, so nothing outside its range is read), step ``q``'s sum taking the new
value only where ``q`` is below the trip count. The terms kept, and their order, are
the loop's: the result is the same bits, on every target. Longer loops, and empty
ones, run as before.

Only cheap bodies are copied (loads, adds, multiplies, conversions: no division,
whose integer form may trap on a discarded step, no mathematical function, whose cost
the copies would multiply), and only float sums: an integer sum's discarded step may
overflow, which C leaves undefined. The selects are ``branchless``: the c target
writes them as a blend of the bits (``ucf_blend_f64``), since GCC turned a float
``?:`` back into branches (TTV: 0.95x the loop's time there; blended, 0.54x).
"""

from __future__ import annotations

from dataclasses import replace

from ucf.ir import nodes as ir
from ucf.ir.nodes import I64, Const, Var
from ucf.ir.walk import declared, fresh_name, names, nodes, substitute, with_blocks
from ucf.passes.tiling import serial_loop

#: The expressions a copied body may hold.
_CHEAP = (Var, Const, ir.Load, ir.Bin, ir.FMA, ir.Cast, ir.Neg)
_CHEAP_OPS = ("+", "-", "*", "min", "max", "<<", ">>", "&")


def unbranch_short_sums(fn: ir.Function, widths: dict[str, int]) -> tuple[ir.Function, list[str]]:
    """``fn`` with each sum over a loop that ``widths`` names (by its label, the
    schedule's name for it: ``branchless(k, 4)``) run without a branch on its trip
    count where that is 1 to its width, and a note per loop (for ``k.cin``)."""
    if not widths:
        return fn, []
    taken = declared(fn.body) | {p.name for p in fn.params}
    notes: dict[str, None] = {}
    return replace(fn, body=_block(fn.body, widths, taken, notes)), list(notes)


def _block(
    stmts: list[ir.Stmt], widths: dict[str, int], taken: set[str], notes: dict[str, None]
) -> list[ir.Stmt]:
    out: list[ir.Stmt] = []
    for s in stmts:
        width = widths.get(s.label) if isinstance(s, ir.For) else None
        acc = _sum_of(s) if width else None
        if acc is None:
            out.append(with_blocks(s, lambda b: _block(b, widths, taken, notes)))
            continue
        out += _unbranched(s, acc, width, taken)
        notes[
            f"branchless: the sum over {s.label} into {acc.name} runs {width} steps with "
            f"no branch on its length where it has 1 to {width} terms"
        ] = None
    return out


def _sum_of(s: ir.Stmt) -> Var | None:
    """The float scalar a loop sums into, when the pass rewrites the loop: a serial loop
    of varying trip count whose body declares scalars and assigns only that one, in
    cheap expressions, and reads the loop's variable nowhere else than in them."""
    if not serial_loop(s) or isinstance(ir.sub(s.end, s.start), Const):
        return None
    if not all(isinstance(b, ir.Decl | ir.Assign) for b in s.body):
        return None
    assigns = [b for b in s.body if isinstance(b, ir.Assign)]
    if len(assigns) != 1:
        return None
    acc = assigns[0].var
    if acc.type not in ("f32", "f64") or acc.name in declared(s.body):
        return None
    if acc.name not in names(assigns[0].value) or s.var.name == acc.name:
        return None
    exprs = [b.init if isinstance(b, ir.Decl) else b.value for b in s.body]
    for n in nodes(exprs):
        if not isinstance(n, ir.Expr):
            continue  # an array loaded from
        if not isinstance(n, _CHEAP) or (isinstance(n, ir.Bin) and n.op not in _CHEAP_OPS):
            return None
    if any(isinstance(b, ir.Decl) and acc.name in names(b.init) for b in s.body):
        return None
    return acc


def _unbranched(loop: ir.For, acc: Var, width: int, taken: set[str]) -> list[ir.Stmt]:
    """``loop`` as: its trip count ``n``; where ``1 <= n <= width``, ``width`` copies of
    its body at the clamped positions, each copy's sum kept where its step counts;
    else the loop."""
    n = Var(fresh_name(f"{loop.var.name}_n", taken), I64)
    last = ir.sub(loop.end, Const(1, I64))
    steps: list[ir.Stmt] = []
    for q in range(width):
        at = Var(fresh_name(loop.var.name, taken), I64)
        start = ir.add(loop.start, Const(q, I64)) if q else loop.start
        steps.append(ir.Decl(at, ir.Bin("min", start, last) if q else start))
        renamed: dict[str, ir.Expr] = {loop.var.name: at}
        for b in loop.body:
            if isinstance(b, ir.Decl):
                var = Var(fresh_name(b.var.name, taken), b.var.type)
                steps.append(ir.Decl(var, substitute(b.init, renamed)))
                renamed[b.var.name] = var
                continue
            value = substitute(b.value, renamed)
            if q == 0:  # the loop runs at least once
                steps.append(ir.Assign(acc, value))
                continue
            term = Var(fresh_name(f"{acc.name}_q", taken), acc.type)
            steps.append(ir.Decl(term, value))
            kept = ir.Select(ir.Cmp("<", Const(q, I64), n), term, acc, branchless=True)
            steps.append(ir.Assign(acc, kept))
    short = ir.Logic("and", ir.Cmp(">=", n, Const(1, I64)), ir.Cmp("<=", n, Const(width, I64)))
    return [ir.Decl(n, ir.sub(loop.end, loop.start)), ir.If(short, steps, [loop])]
