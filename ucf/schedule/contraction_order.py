"""The default schedule of a chain of products: each inner reduction computed once,
into a workspace over its one free variable, outside the loops it does not depend on.

``y(i) = A(i,j)*B(j,k)*x(k)`` sums over ``j`` and ``k`` inside the loop over ``i``: the
plain nest multiplies through every path ``(i, j, k)``, a row of B for every entry of
A, where ``t(j) = sum(k, B(j,k)*x(k))`` does not depend on ``i`` and can be computed
once (``A @ (B @ x)``: the entries of B, then those of A). Which sub-products to form
first is the contraction order (opt_einsum's question; TACO leaves it to the user's
``precompute``). Here the model picks, greedily, the factors whose product has a
single variable shared with the rest (a one-dimensional workspace: ``precompute``'s),
at least one variable of its own to sum; forming it, then what is left (``A*B*C*x``:
``C@x``, then ``B@w``), is searched over every such sequence for the smallest
estimate. The plain nest's estimate is the product's multiply-adds, each sparse
operand thinning its variables' extents by its density; a workspace adds the work of
forming it, zeroing it (its extent), and ``WORKSPACE_STEPS`` for allocating it, so a
small dense chain keeps its plain nest. With no statistics (compiling before any
call) the workspaces are taken, since the plain nest is the cliff. Sub-products
whose value has two free variables (``B(j,k)*X(k,l)`` of ``A@B@X``) would need a
two-dimensional workspace, which ``precompute`` does not build: left alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

from ucf.cin.notation import CIN
from ucf.lang.affine import Affine
from ucf.lang.ast import Access, Binary, Sum, accesses, fresh, index_variables, text
from ucf.lang.reductions import peel
from ucf.schedule.commands import Command, PrecomputeCommand
from ucf.schedule.gathering import is_product

#: Allocating, freeing and entering a workspace costs about this many steps of a loop.
WORKSPACE_STEPS = 256.0
#: Chains up to this many factors are searched (every subset of the factors).
MAX_FACTORS = 8


@dataclass(frozen=True)
class _Step:
    """Forming the factors at ``group`` (positions in the factors at that step) into a
    workspace over ``v``, outside the loops over ``out_of``."""

    group: tuple[int, ...]
    v: str
    out_of: tuple[str, ...]


def plan(cin: CIN, stats, why: list[str]) -> list[Command]:
    """The precomputes that form the sub-products of ``cin``'s product in a cheaper
    order than its plain nest, innermost first, and the line that says so in ``why``;
    none when no such order is cheaper (or the statement is no product of a dense
    output with a reduction)."""
    stmt = cin.statement
    summed, body = peel(stmt.rhs)
    flat = _flattened(body)
    if flat is None or not cin.output_format.is_dense:
        return []
    factors, nested = flat
    if not (summed or nested) or not 3 <= len(factors) <= MAX_FACTORS:
        return []
    formats = {cin.slots[n].tensor: cin.slots[n].format for n in cin.slots}
    density = {t: _density(t, factors, formats, stats) for t in formats}
    outs = set(cin.output_vars)
    taken = {*formats, stmt.lhs.tensor, *index_variables(stmt.rhs), *outs}
    names = [fresh("w", taken) for _ in index_variables(stmt.rhs)]
    plain = _cost(factors, outs, stats, density)
    if plain is None:
        steps = _first(factors, nested, outs, names)
        total = None
    else:
        total, steps = _best(tuple(factors), nested, 0, outs, stats, density, names, {})
    commands: list[Command] = []
    formed: list[str] = []
    for depth, step in enumerate(steps):
        name = names[depth]
        spelled = "*".join(text(factors[n]) for n in step.group)
        commands.append(PrecomputeCommand(spelled, step.v, step.v, name))
        loops = ", ".join(step.out_of)
        formed.append(f"{name}({step.v}) = {spelled} once, outside the loops over {loops}")
        factors, nested = _formed(factors, nested, step, name)
    if total is None and commands:
        why.append(
            f"default: precompute {'; then '.join(formed)}: work linear in the operands' "
            "entries, where the plain nest multiplies through every path of the chain "
            "(the extents are unknown before a call)"
        )
    elif commands:
        why.append(
            f"default: precompute {'; then '.join(formed)}: about {total:.2g} steps, where "
            f"the plain nest multiplies through every path of the chain, about {plain:.2g} "
            "multiply-adds"
        )
    elif plain is not None and next(_groups(factors, nested, outs), None) is not None:
        why.append(
            f"default: the plain nest, about {plain:.2g} multiply-adds, no more than forming "
            "a sub-product in a workspace first"
        )
    return commands


def _flattened(body) -> tuple[list[Access], tuple[frozenset[int], ...]] | None:
    """The factors of a product of accesses and nested sums of such products (``A(i,j) *
    sum(k, B(j,k)*x(k))``), with the positions of each nested sum's factors (a step
    forms such a sum whole or leaves it: ``precompute`` takes a nested sum whole); None
    for anything else."""
    factors: list[Access] = []
    nested: list[frozenset[int]] = []

    def walk(e) -> bool:
        if isinstance(e, Binary) and e.op == "*":
            return walk(e.left) and walk(e.right)
        if isinstance(e, Sum) and e.op == "sum" and is_product(e.body):
            found = accesses(e.body)
            nested.append(frozenset(range(len(factors), len(factors) + len(found))))
            factors.extend(found)
            return True
        if isinstance(e, Access):
            factors.append(e)
            return True
        return False

    return (factors, tuple(nested)) if walk(body) else None


def _groups(factors, nested, outs: set[str]):
    """The steps ``factors`` allow: groups whose product has one variable shared with
    the rest or the output, at least one of its own to sum, and some loop of the rest
    it does not depend on; a nested sum's factors are a group whole or in none."""
    for size in range(1, len(factors)):
        for group in combinations(range(len(factors)), size):
            if any(g & set(group) and g != set(group) for g in nested):
                continue
            mine = {v for n in group for v in _vars(factors[n])}
            theirs = {v for n, a in enumerate(factors) if n not in group for v in _vars(a)}
            theirs |= outs
            free, own, out_of = mine & theirs, mine - theirs, theirs - mine
            if len(free) == 1 and own and out_of:
                yield _Step(group, next(iter(free)), tuple(sorted(out_of)))


def _formed(factors, nested, step: _Step, name: str):
    """The factors after ``step`` (the rest, then the workspace ``name`` read at its
    variable) and the positions of the nested sums left."""
    kept = [n for n in range(len(factors)) if n not in step.group]
    where = {n: m for m, n in enumerate(kept)}
    left = tuple(frozenset(where[n] for n in g) for g in nested if not g & set(step.group))
    return [*(factors[n] for n in kept), Access(name, (Affine.var(step.v),))], left


def _first(factors: list[Access], nested, outs: set[str], names: list[str]) -> list[_Step]:
    """Without statistics: the first step each time, until none is left."""
    steps: list[_Step] = []
    while (step := next(_groups(factors, nested, outs), None)) is not None:
        factors, nested = _formed(factors, nested, step, names[len(steps)])
        steps.append(step)
    return steps


def _best(
    factors: tuple[Access, ...], nested, depth: int, outs, stats, density, names, memo
) -> tuple[float, tuple]:
    """The smallest estimate for ``factors`` (after ``depth`` steps) and the steps that
    reach it: the plain nest, or some group formed first (its work, zeroing and
    allocating its workspace), then the best for what is left. Memoized."""
    if (factors, nested, depth) in memo:
        return memo[factors, nested, depth]
    best: tuple[float, tuple] = (_cost(list(factors), outs, stats, density), ())
    for step in _groups(list(factors), nested, outs):
        produce = _cost([factors[n] for n in step.group], {step.v}, stats, density)
        produce += WORKSPACE_STEPS + stats.extents.get(step.v, 1)
        if produce >= best[0]:
            continue
        rest, left = _formed(list(factors), nested, step, names[depth])
        cost, steps = _best(tuple(rest), left, depth + 1, outs, stats, density, names, memo)
        if produce + cost < best[0]:
            best = (produce + cost, (step, *steps))
    memo[factors, nested, depth] = best
    return best


def _cost(factors: list[Access], outs: set[str], stats, density: dict[str, float]):
    """Multiply-adds of the product of ``factors`` over its variables and ``outs``: the
    extents' product thinned by each sparse factor's density (None without stats)."""
    if stats is None:
        return None
    variables = {v for a in factors for v in _vars(a)} | outs
    work = float(math.prod(stats.extents.get(v, 1) for v in variables))
    for a in factors:
        work *= density.get(a.tensor, 1.0)
    return work


def _density(tensor: str, factors: list[Access], formats, stats) -> float:
    """The stored fraction of a sparse operand (1.0 for a dense one, or unknown)."""
    if stats is None or formats[tensor].is_dense or tensor not in stats.nnz:
        return 1.0
    a = next(a for a in factors if a.tensor == tensor)
    size = math.prod(stats.extents.get(v, 1) for v in _vars(a))
    return min(1.0, stats.nnz[tensor] / max(size, 1))


def _vars(a: Access) -> set[str]:
    return {v for i in a.indices for v in i.variables}
