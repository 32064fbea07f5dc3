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
call) the workspaces are taken, since the plain nest is the cliff.

A sub-product whose value has two free variables (``B(j,k)*X(k,l)`` of ``A@B@X``, or
``X(i,k)*A(k,j)`` of ``X@A@B``) goes into a dense two-dimensional workspace
(``precompute(expr, {j,l}, {j,l}, W)``), its variables in the loop order's order, so
both its producer and its consumer walk it row by row. Its zeroing (the extents'
product) counts in its estimate, and it is never larger than ``MAX_WORKSPACE``
entries. Without statistics it is taken only where a dense factor of the group
holds one of its variables (``X``'s columns, or rows), so it is no larger than the
operands the caller already holds, give or take the ratio of two extents.
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
from ucf.schedule.multiply_adds import multiply_adds

#: Allocating, freeing and entering a workspace costs about this many steps of a loop.
WORKSPACE_STEPS = 256.0
#: Chains up to this many factors are searched (every subset of the factors).
MAX_FACTORS = 8
#: The largest workspace over two variables, in entries (128 MB of float64).
MAX_WORKSPACE = 1 << 24


@dataclass(frozen=True)
class _Step:
    """Forming the factors at ``group`` (positions in the factors at that step) into a
    workspace over ``v`` (one variable, or two in loop order), outside the loops over
    ``out_of``."""

    group: tuple[int, ...]
    v: tuple[str, ...]
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
    sparse = frozenset(t for t, f in formats.items() if not f.is_dense)
    outs = set(cin.output_vars)
    taken = {*formats, stmt.lhs.tensor, *index_variables(stmt.rhs), *outs}
    names = [fresh("w", taken) for _ in index_variables(stmt.rhs)]
    plain = _cost(factors, outs, stats, sparse)
    chain = _Chain(outs, stats, sparse, formats, tuple(cin.order), names)
    if plain is None:
        steps = _first(factors, nested, chain)
        total = None
    else:
        total, steps = _best(tuple(factors), nested, 0, chain, {})
    commands: list[Command] = []
    formed: list[str] = []
    for depth, step in enumerate(steps):
        name = names[depth]
        spelled = "*".join(text(factors[n]) for n in step.group)
        v, *more = step.v
        commands.append(PrecomputeCommand(spelled, v, v, name, tuple(more)))
        loops = ", ".join(step.out_of)
        at = ",".join(step.v)
        formed.append(f"{name}({at}) = {spelled} once, outside the loops over {loops}")
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
    elif plain is not None and next(_groups(factors, nested, chain), None) is not None:
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


@dataclass(frozen=True)
class _Chain:
    """What every step of the search reads: the output's variables, the statistics
    (None before a call), the sparse operands, each operand's format, the loop order (a
    workspace's variables go in its order) and the workspaces' names, one per step."""

    outs: set[str]
    stats: object
    sparse: frozenset[str]
    formats: dict
    order: tuple[str, ...]
    names: list[str]


def _groups(factors, nested, chain: _Chain):
    """The steps ``factors`` allow: groups whose product has one or two variables shared
    with the rest or the output, at least one of its own to sum, and some loop of the
    rest it does not depend on; a nested sum's factors are a group whole or in none. A
    group over two variables must fit ``MAX_WORKSPACE`` (without statistics: a dense
    factor of the group holds one of them)."""
    for size in range(1, len(factors)):
        for group in combinations(range(len(factors)), size):
            if any(g & set(group) and g != set(group) for g in nested):
                continue
            mine = {v for n in group for v in _vars(factors[n])}
            theirs = {v for n, a in enumerate(factors) if n not in group for v in _vars(a)}
            theirs |= chain.outs
            free, own, out_of = mine & theirs, mine - theirs, theirs - mine
            if not (own and out_of) or len(free) not in (1, 2):
                continue
            v = tuple(sorted(free, key=lambda x: _place(x, chain.order)))
            if len(v) == 2 and not _fits(v, [factors[n] for n in group], chain):
                continue
            yield _Step(group, v, tuple(sorted(out_of)))


def _place(v: str, order: tuple[str, ...]) -> tuple[int, str]:
    return (order.index(v) if v in order else len(order), v)


def _fits(v: tuple[str, ...], group: list[Access], chain: _Chain) -> bool:
    """Whether a workspace over the two variables ``v`` may be built for ``group``."""
    if chain.stats is None:
        # an earlier step's workspace is no operand: dense
        dense = [
            a for a in group if a.tensor not in chain.formats or chain.formats[a.tensor].is_dense
        ]
        return any(x in _vars(a) for x in v for a in dense)
    return math.prod(chain.stats.extents.get(x, 1) for x in v) <= MAX_WORKSPACE


def _formed(factors, nested, step: _Step, name: str):
    """The factors after ``step`` (the rest, then the workspace ``name`` read at its
    variables) and the positions of the nested sums left."""
    kept = [n for n in range(len(factors)) if n not in step.group]
    where = {n: m for m, n in enumerate(kept)}
    left = tuple(frozenset(where[n] for n in g) for g in nested if not g & set(step.group))
    workspace = Access(name, tuple(Affine.var(v) for v in step.v))
    return [*(factors[n] for n in kept), workspace], left


def _first(factors: list[Access], nested, chain: _Chain) -> list[_Step]:
    """Without statistics: the first step each time, until none is left."""
    steps: list[_Step] = []
    while (step := next(_groups(factors, nested, chain), None)) is not None:
        factors, nested = _formed(factors, nested, step, chain.names[len(steps)])
        steps.append(step)
    return steps


def _best(factors: tuple[Access, ...], nested, depth: int, chain: _Chain, memo) -> tuple:
    """The smallest estimate for ``factors`` (after ``depth`` steps) and the steps that
    reach it: the plain nest, or some group formed first (its work, zeroing and
    allocating its workspace), then the best for what is left. Memoized."""
    if (factors, nested, depth) in memo:
        return memo[factors, nested, depth]
    stats, sparse = chain.stats, chain.sparse
    best: tuple[float, tuple] = (_cost(list(factors), chain.outs, stats, sparse), ())
    for step in _groups(list(factors), nested, chain):
        produce = _cost([factors[n] for n in step.group], set(step.v), stats, sparse)
        produce += WORKSPACE_STEPS + math.prod(stats.extents.get(v, 1) for v in step.v)
        if produce >= best[0]:
            continue
        rest, left = _formed(list(factors), nested, step, chain.names[depth])
        cost, steps = _best(tuple(rest), left, depth + 1, chain, memo)
        if produce + cost < best[0]:
            best = (produce + cost, (step, *steps))
    memo[factors, nested, depth] = best
    return best


def _cost(factors: list[Access], outs: set[str], stats, sparse: frozenset[str]):
    """Multiply-adds of the product of ``factors`` over its variables and ``outs``
    (``multiply_adds``; None without stats)."""
    return None if stats is None else multiply_adds(factors, stats, sparse, outs)


def _vars(a: Access) -> set[str]:
    return {v for i in a.indices for v in i.variables}
