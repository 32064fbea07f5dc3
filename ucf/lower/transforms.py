"""Schedule transformations applied to a lowered loop nest.

The lowerer builds one loop per original index variable (or per ``pos`` or
fused-``pos`` variable) and labels each with its schedule name.  The commands
that only restructure loops - split, divide, fuse, bound, unroll, reorder and
parallelize - then work here on those labelled LLIR loops.  Each checks its
precondition on the nest it is given and raises ``ScheduleError`` naming the
loop and the rule, so an illegal schedule never produces wrong code.
"""

from __future__ import annotations

from dataclasses import replace

from ucf.errors import ScheduleError
from ucf.ir import nodes as ir
from ucf.ir.nodes import Const, Var
from ucf.ir.visit import Visitor, handles
from ucf.ir.walk import (
    assigned,
    declared,
    loops,
    nodes,
    reads,
    statements,
    substitute,
)
from ucf.lower.nest import I64, Nest, has_load, index_of, take_entry
from ucf.lower.parallel import mark_independent, parallelize
from ucf.lower.work import add_work_thresholds
from ucf.schedule import Command, Parallel, Split
from ucf.schedule.commands import Arrange, BoundCommand, Fuse, SplitCommand, Unroll


def apply(nest: Nest, steps: list[Command], parallel: dict[str, Parallel]) -> None:
    """Run the steps in order; the loops are arranged into the final order once, at the end.

    The lowerer already builds the original variables in the order the final
    loops imply, so only interleavings of derived loops are left to arrange. The
    assemble pass of a sparse output stops once every appended coordinate is placed
    (``nest.partial``): a command on a loop further in does not apply to it.
    """
    transforms = _Transforms(nest)
    for k, cmd in enumerate(steps):
        if isinstance(cmd, Arrange) and k != len(steps) - 1:
            continue
        if transforms.applies(cmd):
            transforms.visit(cmd)
    threaded = frozenset(v for v, par in parallel.items() if par.unit == "CPUThread")
    for label, par in parallel.items():
        if nest.has(label) or not nest.partial:
            parallelize(nest, label, par, threaded)
    mark_independent(nest)
    _check_vector_nesting(nest.body, parallel)
    add_work_thresholds(nest.body)


def _check_vector_nesting(body: list[ir.Stmt], parallel: dict[str, Parallel]) -> None:
    """Vector lanes run in lockstep inside one thread, so they cannot start threads."""
    for _, outer in loops(body):
        if not (isinstance(outer, ir.For) and outer.parallel == "CPUVector"):
            continue
        for _, inner in loops([*outer.prologue, *outer.body]):
            if isinstance(inner, ir.For) and inner.parallel == "CPUThread":
                raise ScheduleError(
                    f"parallelize({inner.label}, {parallel[inner.label]}): {inner.label} is "
                    f"inside {outer.label}, which runs on vector lanes, and lanes cannot start "
                    f"threads; run {inner.label} on CPUThread only outside every CPUVector loop"
                )


class _Transforms(Visitor):
    """The loop commands on the labelled LLIR loops of one nest, one handler each."""

    refusal = "no loop transformation for"

    def __init__(self, nest: Nest):
        self.nest = nest

    def applies(self, cmd: Command) -> bool:
        """Whether ``cmd`` applies to this nest: its loop is in it, or the nest is whole
        (then a missing loop is the command's error to report)."""
        loop = cmd.outer if isinstance(cmd, Fuse) else getattr(cmd, "var", None)
        return loop is None or not self.nest.partial or self.nest.has(loop)

    @handles(SplitCommand)
    def split(self, cmd: SplitCommand) -> None:
        strip_mine(self.nest, cmd.split, str(cmd))

    @handles(Fuse)
    def fuse(self, cmd: Fuse) -> None:
        _fuse_loops(self.nest, cmd.outer, cmd.inner, cmd.fused, str(cmd))

    @handles(BoundCommand)
    def bound(self, cmd: BoundCommand) -> None:
        bound(self.nest, cmd.var, cmd.bound_var, cmd.amount, str(cmd))

    @handles(Unroll)
    def unroll(self, cmd: Unroll) -> None:
        for _, _, loop in self.nest.find_all(cmd.var, str(cmd)):
            loop.unroll = cmd.factor

    @handles(Arrange)
    def arrange(self, cmd: Arrange) -> None:
        arrange(self.nest, list(cmd.order), f"reorder({', '.join(cmd.order)})")


# ------------------------------------------------------------------ split
def strip_mine(nest: Nest, split: Split, cmd: str) -> None:
    """``for x in [a, b)`` as an outer loop over blocks and an inner loop within one.

    The inner bound is clipped to the range, so a tail needs no guard and the
    inner loop still vectorizes.  State a loop re-establishes at the start of
    a range (a fused ``pos`` loop's parent positions) moves into the outer
    loop, so blocks are independent.
    """
    container, k, loop = nest.find(split.var, cmd)
    if split.var in nest.clipped:
        # Splitting a split's inner loop: its blocks must not depend on the outer one.
        _unclip(nest, loop)
    base = Var(f"{loop.var.name}_base", I64)
    entry, k = take_entry(nest, split.var, container, k, base)
    x = loop.var.name
    lo, hi = Var(f"{x}_lo", I64), Var(f"{x}_hi", I64)
    outer, inner = Var(split.outer, I64), Var(split.inner, I64)
    count_ = ir.sub(hi, lo)
    prelude: list[ir.Stmt] = [ir.Decl(lo, loop.start), ir.Decl(hi, loop.end)]
    one = Const(1, I64)
    if split.mode == "split":
        chunk: ir.Expr = Const(split.amount, I64)
        blocks = ir.Bin("/", ir.add(count_, Const(split.amount - 1, I64)), chunk)
    else:
        chunk = Var(f"{x}_chunk", I64)
        parts = Const(split.amount, I64)
        prelude.append(ir.Decl(chunk, ir.Bin("/", ir.sub(ir.add(count_, parts), one), parts)))
        blocks = parts
    inner_loop = ir.For(
        inner,
        Const(0, I64),
        ir.minimum(chunk, ir.sub(hi, base)),
        [ir.Decl(loop.var, ir.add(base, inner)), *loop.body],
        label=split.inner,
        unroll=loop.unroll,
    )
    outer_body = [ir.Decl(base, ir.add(lo, ir.mul(outer, chunk))), *entry, inner_loop]
    outer_loop = ir.For(outer, Const(0, I64), blocks, outer_body, label=split.outer)
    container[k : k + 1] = [*prelude, outer_loop]
    nest.clipped[split.inner] = (ir.add(base, inner), hi, chunk)


def _unclip(nest: Nest, inner: ir.For) -> None:
    """Run a split's inner loop over the full block and guard the tail instead.

    The clipped bound depends on the outer loop, which keeps the inner loop
    from moving outside it; a guard on the original coordinate, placed around
    the innermost body, does not.  The guard stops above the first loop whose
    bounds, or declaration before it, read memory: past the tail those reads
    (say ``A1_pos[i + 1]``) would be out of bounds, and such a loop depends on
    the guarded coordinate anyway, so it could not move outside it.
    """
    coord, hi, chunk = nest.clipped.pop(inner.label)
    inner.end = chunk
    deepest = inner
    while True:
        body = deepest.body
        nxt = body[-1] if body else None
        prefix_ok = all(isinstance(s, ir.Decl) and not has_load(s.init) for s in body[:-1])
        if isinstance(nxt, ir.For) and prefix_ok and not has_load(nxt.start, nxt.end):
            deepest = nxt
            continue
        break
    guard = ir.Cmp("<", coord, hi)  # not the coordinate's name: a load may precede its Decl
    body = deepest.body
    k = 0  # declarations that read no memory stay outside, so the guard can see them
    while k < len(body) and isinstance(body[k], ir.Decl) and not has_load(body[k].init):
        k += 1
    deepest.body = [*body[:k], ir.If(guard, body[k:])]


# ------------------------------------------------------------------ bound
def bound(nest: Nest, var: str, new: str, n: int, cmd: str) -> None:
    """The loop over ``var`` runs ``n`` times, which each call checks (``Bound.check``).

    ``var`` may be a split's outer loop: each call checks ``n`` against the blocks
    of the whole dimension, and where an affine window narrows the loop, the runs
    past the window's blocks are empty, since the inner loop clips to the window.
    """
    _, _, loop = nest.find(var, cmd)
    if loop.var.name != var:
        raise ScheduleError(
            f"{cmd}: the loop over {var} walks a sparse operand's positions; bound applies "
            "to a dense loop over the whole dimension"
        )
    if not (isinstance(loop.start, Const) and loop.start.value == 0):
        raise ScheduleError(
            f"{cmd}: the loop over {var} is narrowed to where an affine index stays inside "
            f"its operand, so its trip count varies; bound applies to a loop over the whole "
            f"dimension (bound a variable that indexes no window, or reorder so that another "
            f"variable of that index is inside {var})"
        )
    loop.end = Const(n, I64)
    loop.label = new


# ------------------------------------------------------------------ reorder
def _split_prefix(loop: ir.For | ir.While, what: str) -> tuple[list[ir.Stmt], ir.Stmt]:
    """A loop body that only declares values and then runs one inner loop, or an error."""
    body = loop.body
    inner = body[-1] if body else None
    prefix = body[:-1]
    if not isinstance(inner, ir.For | ir.While) or not all(isinstance(s, ir.Decl) for s in prefix):
        raise ScheduleError(
            f"{what}: the loop over {loop.label} does more than run the loop inside it (it "
            "accumulates, appends to a sparse output, or co-iterates), so loops cannot move "
            "across it"
        )
    return prefix, inner


def _hoist(prefix: list[ir.Stmt], needed: set[str], banned: set[str]):
    """Split ``prefix`` into declarations ``needed`` depends on and the rest."""
    need = set(needed)
    take = [False] * len(prefix)
    for k in range(len(prefix) - 1, -1, -1):
        s = prefix[k]
        if s.var.name in need:
            take[k] = True
            reads(s.init, need)
    if need & banned:
        return None
    return [s for s, t in zip(prefix, take, strict=True) if t], [
        s for s, t in zip(prefix, take, strict=True) if not t
    ]


def interchange(nest: Nest, container: list[ir.Stmt], outer: ir.For, what: str) -> None:
    """Move the loop inside ``outer`` outward, around it.

    The inner loop may sit under the tail guard of a split and after the catch-up
    loops of a fused ``pos`` (the row of the current nonzero). Each iteration of
    the moved loop then runs ``outer`` from the start, with its own copy of that
    row: the catch-up reaches the same row from any earlier start.
    """
    found = _inner_path(outer.body)
    if found is None:
        raise ScheduleError(
            f"{what}: the loop over {outer.label} does more than run the loop inside it (it "
            "accumulates, appends to a sparse output, or co-iterates), so loops cannot move "
            "across it"
        )
    prefix, inner = found
    if isinstance(inner, ir.While):
        raise ScheduleError(
            f"{what}: the loop inside {outer.label} co-iterates sparse operands with a while "
            "loop and cannot move outward"
        )
    if nest.sparse_out:
        raise ScheduleError(
            f"{what}: the sparse output is appended in loop order, so {inner.label} cannot "
            f"move outside {outer.label}"
        )
    if inner.label in nest.entries:
        raise ScheduleError(
            f"{what}: {inner.label} resumes a search at each block and cannot move outward"
        )
    decls = [s for s, _ in prefix if isinstance(s, ir.Decl)]
    # A guarded declaration that reads memory may only be evaluated under its guard.
    unsafe = {
        s.var.name
        for s, guarded in prefix
        if guarded and isinstance(s, ir.Decl) and has_load(s.init)
    }
    banned = {outer.var.name} | assigned(outer.body) | unsafe
    needed: set[str] = set()
    reads([inner.start, inner.end], needed)
    split = _hoist(decls, needed, banned)
    if split is None and inner.label in nest.clipped:
        _unclip(nest, inner)
        needed = set()
        reads([inner.start, inner.end], needed)
        split = _hoist(decls, needed, banned)
    if split is None:
        raise ScheduleError(
            f"{what}: the bounds of {inner.label} depend on {outer.label}, so {inner.label} "
            f"cannot move outside {outer.label}"
        )
    hoisted, rest = split
    rows = {
        s.body[0].var.name: s.body[0].var
        for s, _ in prefix
        if isinstance(s, ir.While) and s.body[0].var.name not in declared(outer.body)
    }
    for name in rows:
        if not catches_up(outer.body, name):
            raise ScheduleError(
                f"{what}: the loop over {outer.label} carries {name} from one iteration to "
                f"the next, so {inner.label} cannot move outside it"
            )
    state = _restarted(rest, inner) + [v for v in _ordered_state(outer) if v not in rows]
    if state:
        raise ScheduleError(
            f"{what}: the loops over {outer.label} and {inner.label} step {state[0]} from one "
            "iteration to the next in order (the position of a sparse operand walked beside a "
            f"dense loop), so {inner.label} cannot move outside {outer.label}"
        )
    own = {n: Var(f"{n}_{inner.var.name}", v.type) for n, v in rows.items()}
    body = substitute(_spliced(outer.body, inner, {id(s) for s in hoisted}), own)
    copies = [ir.Decl(own[n], v) for n, v in rows.items()]
    new_inner = replace(inner, body=[*copies, replace(outer, body=body)])
    k = index_of(container, outer)
    container[k : k + 1] = [*hoisted, new_inner]


def _restarted(rest: list[ir.Stmt], inner: ir.For) -> list[str]:
    """Variables declared in ``rest`` that ``inner`` updates: a rewrite that runs ``rest``
    once per iteration of ``inner`` would reset them."""
    return sorted(assigned(inner.body) & {d.var.name for d in rest})


def _ordered_state(outer: ir.For) -> list[str]:
    """Variables declared outside ``outer`` that its iterations update in an order that
    matters: everything but running sums (``t = t + e``) and flags set to a constant."""
    return [
        v
        for v in sorted(assigned(outer.body) - declared(outer.body))
        if not _order_free(outer.body, v)
    ]


def _order_free(body: list[ir.Stmt], name: str) -> bool:
    """Whether ``name`` is only ever summed into or set to a constant, and read nowhere
    else in ``body``, so its final value does not depend on the order of iterations."""
    v = next(n for n in nodes(body) if isinstance(n, Var) and n.name == name)
    updates = [s for s in statements(body) if isinstance(s, ir.Assign) and s.var == v]
    sums = [
        s
        for s in updates
        if isinstance(s.value, ir.Bin)
        and s.value.op == "+"
        and s.value.left == v
        and v not in nodes(s.value.right)
    ]
    constants = [s for s in updates if isinstance(s.value, Const)]
    uses = sum(1 for n in nodes(body) if n == v)
    return len(sums) + len(constants) == len(updates) and uses == len(updates) + len(sums)


def _inner_path(stmts: list[ir.Stmt], guarded: bool = False):
    """The loop ``stmts`` end with, possibly inside ``if`` guards without an else, and the
    statements before it on the way, each with whether a guard encloses it; ``None`` unless
    those are all declarations and catch-up loops."""
    if not stmts:
        return None
    *prefix, last = stmts
    if not all(isinstance(s, ir.Decl) or _catch_up(s) for s in prefix):
        return None
    before = [(s, guarded) for s in prefix]
    if isinstance(last, ir.For | ir.While):
        return before, last
    if isinstance(last, ir.If) and not last.orelse:
        found = _inner_path(last.then, True)
        if found is not None:
            return before + found[0], found[1]
    return None


def _spliced(stmts: list[ir.Stmt], inner: ir.Stmt, drop: set[int]) -> list[ir.Stmt]:
    """``stmts`` with ``inner`` replaced by its body and the statements in ``drop`` removed."""
    out: list[ir.Stmt] = []
    for s in stmts:
        if s is inner:
            out += inner.body
        elif isinstance(s, ir.If):
            out.append(replace(s, then=_spliced(s.then, inner, drop)))
        elif id(s) not in drop:
            out.append(s)
    return out


def _catch_up(s: ir.Stmt) -> bool:
    """``while (...) q = q + 1``: a fused ``pos`` loop advancing its parent position."""
    if not (isinstance(s, ir.While) and len(s.body) == 1 and isinstance(s.body[0], ir.Assign)):
        return False
    var = s.body[0].var
    return s.body[0].value == ir.add(var, Const(1, var.type))


def catches_up(body: list[ir.Stmt], name: str) -> bool:
    """Every assignment of ``name`` is a catch-up loop (``_catch_up``), which reaches the
    same value from any earlier start: a copy may restart from an earlier value."""
    allowed = {id(s.body[0]) for s in statements(body) if _catch_up(s)}
    return all(
        id(s) in allowed
        for s in statements(body)
        if isinstance(s, ir.Assign) and s.var.name == name
    )


def arrange(nest: Nest, order: list[str], what: str) -> None:
    """Interchange adjacent loops until the labelled loops nest in ``order``."""
    rank = {v: k for k, v in enumerate(order)}
    for _ in range(len(order) ** 2 + 1):
        moved = False
        for container, loop in loops(nest.body):
            if loop.label not in rank or not isinstance(loop, ir.For):
                continue
            inner = _next_labelled(loop)
            if inner is not None and inner.label in rank and rank[inner.label] < rank[loop.label]:
                if nest.sparse_out:
                    raise ScheduleError(
                        f"{what}: the sparse output is appended in loop order, so {inner.label} "
                        f"cannot move outside {loop.label}"
                    )
                if not _ends_with(loop.body, inner):
                    raise ScheduleError(
                        f"{what}: {inner.label} is not the only loop inside {loop.label}, so "
                        "they cannot be interchanged"
                    )
                interchange(nest, container, loop, what)
                moved = True
                break
        if not moved:
            return
    raise ScheduleError(f"{what}: the loops cannot be arranged in this order")


def _ends_with(stmts: list[ir.Stmt], inner: ir.Stmt) -> bool:
    """``inner`` is the last statement, or the last one inside a final ``if`` without else."""
    last = stmts[-1] if stmts else None
    if isinstance(last, ir.If) and not last.orelse:
        return _ends_with(last.then, inner)
    return last is inner


def _next_labelled(loop: ir.For) -> ir.For | ir.While | None:
    for _, inner in loops(loop.body):
        if inner.label:
            return inner
    return None


# ------------------------------------------------------------------ fuse
def _fuse_loops(nest: Nest, i: str, j: str, f: str, what: str) -> None:
    container, k, outer = nest.find(i, what)
    nested = next((s for s in outer.body if isinstance(s, ir.For | ir.While)), None)
    sparse_inner = isinstance(nested, ir.While) or (
        isinstance(nested, ir.For) and nested.var.name != j
    )
    if outer.var.name != i or sparse_inner:
        who = i if outer.var.name != i else j
        raise ScheduleError(
            f"{what}: the loop over {who} walks a sparse operand's positions; fuse dense loops, "
            f"or add pos({f}, {f}pos, T) after the fuse to walk T's nonzeros across both"
        )
    prefix, inner = _split_prefix(outer, what)
    if inner.label != j:
        raise ScheduleError(f"{what}: the loop directly inside {i} is not {j}")
    needed: set[str] = set()
    reads([inner.start, inner.end], needed)
    split = _hoist(prefix, needed, {i} | assigned(outer.body))
    if split is None:
        raise ScheduleError(f"{what}: the extent of {j} depends on {i}")
    hoisted, rest = split
    state = _restarted(rest, inner)
    if state:
        raise ScheduleError(
            f"{what}: the loop over {j} carries {state[0]} from one iteration to the next (the "
            f"position of a sparse operand walked beside a dense loop), which the fused loop "
            f"would restart at every {f}; fuse loops that only index dense operands"
        )
    fv = Var(f, I64)
    n_j = Var(f"{f}_n{j}", I64)
    body = [
        ir.Decl(Var(i, I64), ir.add(outer.start, ir.Bin("/", fv, n_j))),
        *rest,
        ir.Decl(Var(j, I64), ir.add(inner.start, ir.Bin("%", fv, n_j))),
        *inner.body,
    ]
    n_i = ir.sub(outer.end, outer.start)
    fused = ir.For(fv, Const(0, I64), ir.mul(n_i, n_j), body, label=f)
    container[k : k + 1] = [*hoisted, ir.Decl(n_j, ir.sub(inner.end, inner.start)), fused]
