"""The default schedule of a sum of products: Gustavson's row workspace, the way one
product (SpGEMM on CSR) gets it.

``C(i,j) = A(i,k)*B(k,j) + D(i,l)*E(l,j)`` computes each sum where its value is
needed, for every ``(i, j)``: in the plain loop order the sums run inside ``j``, so
B and E are read by column (converted on every call) and every pair ``(i, j)``
co-iterates a row of A with a column of B, whatever C holds. A workspace over ``j``
gathers a whole row instead: each product scatters its rows into it in turn, so the
work is the products' multiply-adds. The model compares the two estimates, says
which it chose in ``k.cin``, and proposes one workspace for the whole sum (one list
of touched columns, one sort, one pass that appends the row), then one workspace per
term (their lists merged when the row is appended) should the checks refuse it.
"""

from __future__ import annotations

import math

from ucf.cin.concretize import Gathered
from ucf.cin.notation import CIN
from ucf.format.format import Format
from ucf.lang.ast import Access, Binary, Expr, Statement, Sum, accesses, text
from ucf.lang.reductions import peel
from ucf.schedule.commands import Command, PrecomputeCommand
from ucf.schedule.multiply_adds import multiply_adds


def terms(rhs: Expr) -> list[tuple[int, Expr]] | None:
    """The signed terms of a sum of at least two products of accesses (each possibly
    under its own sum), after the statement's outer sum; None for anything else."""
    body = peel(rhs)[1]
    found: list[tuple[int, Expr]] = []

    def walk(e: Expr, sign: int) -> bool:
        if isinstance(e, Binary) and e.op in "+-":
            return walk(e.left, sign) and walk(e.right, -sign if e.op == "-" else sign)
        product = e
        while isinstance(product, Sum) and product.op == "sum":  # max and min gather no rows
            product = product.body
        # A term with no sum of its own (A(i,j) in A(i,j) + B(i,k)*C(k,j)) is a producer
        # of its own too, scattered once per row beside the others' sums.
        if not is_product(product):
            return False
        found.append((sign, product))
        return True

    return found if walk(body, 1) and len(found) > 1 else None


def is_product(e: Expr) -> bool:
    """A product of tensor accesses: what precompute can compute into a workspace."""
    if isinstance(e, Binary):
        return e.op == "*" and is_product(e.left) and is_product(e.right)
    return isinstance(e, Access)


def row_variable(stmt: Statement, out: Format) -> str | None:
    """The output variable a row workspace runs over: the output's innermost one, the
    one its last stored level holds."""
    if not stmt.lhs.indices:
        return None
    return stmt.lhs.indices[out.mode_order[-1]].single_variable


def gathering(stmt: Statement, out: Format) -> Gathered | None:
    """The precompute of a whole sum of products as the loop order sees it
    (``ucf.cin.concretize.nesting``): every access, over the row variable."""
    v = row_variable(stmt, out)
    if v is None or terms(stmt.rhs) is None:
        return None
    return frozenset(str(a) for a in accesses(stmt.rhs)), v


def workspaces(cin: CIN, stats, why: list[str]) -> list[list[Command]]:
    """The workspace plans of a sum of products, best first: the whole sum into one
    workspace, then each term into its own; appends to ``why`` the line that says what
    was chosen against what."""
    stmt = cin.statement
    found = terms(stmt.rhs)
    v = row_variable(stmt, cin.output_format)
    if found is None or v is None:
        return []
    spelled = [text(t) for _, t in found]
    whole = spelled[0]
    for (sign, _), t in zip(found[1:], spelled[1:], strict=True):
        whole += f" {'+' if sign > 0 else '-'} {t}"
    shared = [PrecomputeCommand(whole, v, v)]
    apart = [PrecomputeCommand(t, v, v) for t in spelled]
    out = stmt.lhs.tensor
    pairs = ", ".join(cin.output_vars)
    products, visits = _work(cin, stats, [t for _, t in found])
    if products is None:
        cost = (
            f"work linear in the products' multiply-adds, where co-iterating every ({pairs}) "
            f"of {out} with the sums visits every pair (the extents are unknown before a call)"
        )
    else:
        cost = (
            f"about {products:.2g} multiply-adds, where co-iterating every ({pairs}) of "
            f"{out} with the sums would take about {visits:.2g} steps"
        )
    why.append(
        f"default: precompute {whole} into one workspace over {v}, each product scattering "
        f"its rows into it in turn (Gustavson's algorithm per product): {cost}"
    )
    return [shared, apart]


#: A step of co-iterating several sparse operands' fibers (the union of their
#: coordinates, one loop with a case per subset present) costs about this many steps
#: of a loop over one fiber: it compares coordinates and branches between the cases.
MERGE_STEPS = 2.0


#: Converting a sparse operand on every call (a transposing copy: count, place, copy)
#: costs about this many steps of a loop over one fiber per stored entry.
CONVERT_STEPS = 4.0


def distributed(cin: CIN, stats, why: list[str]) -> list[list[Command]]:
    """The plan that distributes the statement's outer sum over its terms when the terms
    read different sparse operands: ``y(i) = A(i,j)*x(j) + B(i,j)*x(j)`` co-iterates
    the union of a row of A and a row of B (one loop with merge cases), where
    ``sum(j, A*x) + sum(j, B*x)`` runs two plain loops. Each term is precomputed over
    the output's innermost variable in turn (summed in another order than the
    co-iterated loop, as for a sparse output's sum of products). A product the user
    factored (``(A(i,j) + B(i,j))*x(j)``) is not a sum of terms and is left alone.
    Terms that read one operand in two orders (``A(i,j)*x(j) + A(j,i)*x(j)``: the plain
    nest converts A on every call) get the plan too: with a dense output, each term's
    producer walks its operand as stored (``ucf.schedule.own_order``).
    Appends to ``why`` the line that says which was chosen; none when the terms share
    their sparse operands in one order."""
    stmt = cin.statement
    found = terms(stmt.rhs)
    v = row_variable(stmt, cin.output_format)
    summed = peel(stmt.rhs)[0]
    if found is None or v is None or not summed:
        return []
    formats = {cin.slots[n].tensor: cin.slots[n].format for n in cin.slots}
    reads = [
        frozenset(a.tensor for a in accesses(t) if not formats[a.tensor].is_dense) for _, t in found
    ]
    flipped = _flipped(cin, [t for _, t in found])
    if not flipped and (len(set(reads)) < 2 or not all(reads)):
        return []
    spelled = [text(t) for _, t in found]
    plan = [PrecomputeCommand(t, v, v) for t in spelled]
    over = ", ".join(summed)
    merged = (
        f"one loop over {over} co-iterating {' and '.join(', '.join(sorted(r)) for r in reads)}"
    )
    if flipped:
        merged += (
            f", {', '.join(flipped)} converted on every call (the terms read "
            f"{'it' if len(flipped) == 1 else 'them'} in two orders)"
        )
    apart = (
        f"sum({over}) distributed over the terms, each precomputed over {v} with its own "
        f"loop ({'; '.join(spelled)})"
    )
    if flipped and cin.output_format.is_dense:
        apart += ", each walking its operands as stored"
    products, _ = _work(cin, stats, [t for _, t in found])
    if products is None:
        why.append(
            f"default: {apart}: no merge of their fibers, where {merged} branches between "
            "their cases at every step (the extents are unknown before a call)"
        )
        return [plan]
    pairs = math.prod(stats.extents.get(w, 1) for w in cin.output_vars)
    apart_steps, merged_steps = products + len(found) * pairs, MERGE_STEPS * products
    merged_steps += CONVERT_STEPS * sum(stats.nnz.get(t, 0) for t in flipped)
    if apart_steps >= merged_steps:
        why.append(
            f"default: {merged}, about {merged_steps:.2g} steps, against about "
            f"{apart_steps:.2g} for {apart}"
        )
        return []
    why.append(
        f"default: {apart}: about {apart_steps:.2g} steps, where {merged} would take "
        f"about {merged_steps:.2g}"
    )
    return [plan]


def _flipped(cin: CIN, products: list[Expr]) -> list[str]:
    """The sparse operands the unscheduled nest converts that more than one term reads:
    terms that read one operand in two orders."""
    converted = {s.tensor for s in cin.slots.values() if s.name != s.tensor}
    readers: dict[str, int] = {}
    for p in products:
        for t in {a.tensor for a in accesses(p)}:
            readers[t] = readers.get(t, 0) + 1
    return sorted(t for t in converted if readers.get(t, 0) > 1)


def _work(cin: CIN, stats, products: list[Expr]) -> tuple[float | None, float | None]:
    """The multiply-adds of the products, and the steps of co-iterating every output
    entry with the sums (each pair visits a fiber of every sparse operand)."""
    if stats is None:
        return None, None
    ext = stats.extents
    formats = {cin.slots[n].tensor: cin.slots[n].format for n in cin.slots}
    sparse = {t for t, f in formats.items() if not f.is_dense}
    outs = set(cin.output_vars)
    pairs = math.prod(ext.get(v, 1) for v in outs)
    work = 0.0
    per_pair = 1.0
    for p in products:
        for a in accesses(p):
            if a.tensor not in sparse or a.tensor not in stats.nnz:
                continue
            own = [v for i in a.indices for v in i.variables]
            fixed = math.prod(ext.get(v, 1) for v in own if v in outs)
            per_pair += stats.nnz[a.tensor] / max(fixed, 1)
        work += multiply_adds(accesses(p), stats, sparse)
    return work, pairs * per_pair
