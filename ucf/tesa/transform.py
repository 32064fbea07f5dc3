"""A program rewritten over split operands (SparTA §3.3, Algorithm 3): which inputs
are split into which parts, and the steps that compute the program from them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from itertools import product

import numpy as np

from ucf.errors import OperandError
from ucf.lang.affine import Affine
from ucf.lang.ast import (
    Access,
    Binary,
    Expr,
    accesses,
    children,
    text,
    with_children,
)
from ucf.lang.parser import parse_statement
from ucf.lang.reductions import free_variables
from ucf.lang.rewrite import linear_in, map_accesses
from ucf.tesa.cover import block_cover
from ucf.tesa.graph import Graph
from ucf.tesa.plan import Part, ProgramPlan
from ucf.tesa.policy import Policy
from ucf.tesa.rounding import bit_rounding
from ucf.tesa.terms import added_terms, fused_operand, sum_of, take_fresh, with_parts
from ucf.tesa.transposed import Transposed


def transform(program: Graph, policy: Policy) -> ProgramPlan:
    taken = set(program.shapes)
    splits: dict[str, list[Part]] = {}
    # A wholly pruned operand has no part to split into: it is read whole, zeroed.
    candidates = [
        name
        for name in program.inputs
        if 0 < program.attrs[name].sparsity < 1
        and program.attrs[name].sparsity >= policy.min_sparsity
        and len(program.attrs[name].shape) == 2
    ]
    for name in candidates:
        bits = program.attrs[name].bits
        if bits.max() > max(policy.bits):
            raise OperandError(
                f"tensor {name} has {bits.max()}-bit elements, wider than any width of "
                f"the policy ({sorted(policy.bits)})"
            )
    # The sparsest first: an operand read by a statement beside one already split is read
    # whole (X of X·W when propagation pruned X's columns too), since a product of two
    # operands split into blocks of different orders has no loop order that follows both.
    for name in sorted(candidates, key=lambda n: -program.attrs[n].sparsity):
        if any(name in node.inputs and splits.keys() & set(node.inputs) for node in program.nodes):
            continue
        attr = program.attrs[name]
        rounded = bit_rounding(attr, policy.bits)[0]
        costs = {s: c for s, c in policy.blocks.items() if len(s) == 2}
        if not costs:
            continue
        parts = _parts(name, rounded.bits, costs, taken)
        columns = _rows_summed(program, name)
        splits[name] = [replace(p, columns=columns) for p in parts]
    steps: list[str] = []
    flips = Transposed({p.name: p for ps in splits.values() for p in ps}, taken)
    fused = _fused(program)
    for node in program.nodes:
        if node.output in fused:
            continue
        made: dict[str, tuple[tuple[str, ...], Expr]] = {}

        def piece(indices: tuple[str, ...], term: Expr, node=node, made=made) -> Access:
            name = take_fresh(f"{node.output}_{len(made)}", taken)
            made[name] = (indices, term)
            return Access(name, tuple(Affine.var(v) for v in indices))

        rhs = _distribute(_inlined(node.statement.rhs, fused), node.out_vars, splits, piece)
        steps.extend(_node_steps(node.statement.lhs, rhs, made, flips))
    masks = {
        name: program.attrs[name].mask
        for name in (*program.inputs, *program.outputs)
        if name not in splits and program.attrs[name].sparsity > 0
    }
    steps.extend(flips.restore(program.outputs))
    readers: dict[str, list[str]] = {}
    for step in steps:
        for a in accesses(parse_statement(step).rhs):
            readers.setdefault(a.tensor, []).append(step)
    parts = [
        replace(p, transposed=set(readers.get(p.name, ())) <= flips.products)
        if p.block != (1, 1)
        else p
        for ps in splits.values()
        for p in ps
    ]
    return ProgramPlan(steps, parts, program.outputs, masks, flips.schedules)


def _distribute(
    e: Expr,
    out_vars: tuple[str, ...],
    splits: dict[str, list[Part]],
    piece: Callable[[tuple[str, ...], Expr], Access],
) -> Expr:
    """``e`` over the parts of its split operands. Each top-level additive term that is
    linear in a split operand becomes one sub-statement per part (``piece`` emits it
    and returns its access), a single part included: a blocked part's loops can then
    come first in a step of its own, where beside a bias ``+ B(h)`` its sum would have
    to run inside each output element. A term that is not linear is searched the same
    way for the largest parts that are and whose values the output's variables fix
    (``sum(j, W(i,j) * x(j))`` inside ``relu``): each becomes sub-statements whose sum
    the term reads. Other reads of a split operand read the sum of its parts (one
    kernel then co-iterates the parts, whose blocks no one loop order may follow)."""
    if isinstance(e, Binary) and e.op in "+-":
        return Binary(
            e.op,
            _distribute(e.left, out_vars, splits, piece),
            _distribute(e.right, out_vars, splits, piece),
        )
    names = [n for n in dict.fromkeys(a.tensor for a in e._accesses) if n in splits]
    free = free_variables(e)
    linear = [n for n in names if linear_in(e, n)] if free <= set(out_vars) else []
    if names and not linear and not isinstance(e, Access):
        kids = [_distribute(c, out_vars, splits, piece) for c in children(e)]
        return with_children(e, kids)
    for n in names:
        if n not in linear:
            e = with_parts(e, n, tuple(p.name for p in splits[n]))
    terms = [e]
    for n in linear:
        terms = [with_parts(t, n, (p.name,)) for t, p in product(terms, splits[n])]
    if not linear:
        return e
    indices = tuple(v for v in out_vars if v in free)
    return sum_of([piece(indices, t) for t in terms])


def _node_steps(
    lhs: Access, rhs: Expr, made: Mapping[str, tuple[tuple[str, ...], Expr]], flips: Transposed
) -> list[str]:
    """The steps of one statement whose ``rhs`` reads the sub-statements ``made``.

    Sub-statements added up at the top of ``rhs`` over all of ``lhs``'s indices
    accumulate into the output (``T(t,h) = X·W_0``, then ``T(t,h) += X·W_1``) rather
    than into outputs of their own that one more pass adds: that pass read and wrote
    every element of the output again, and each sub-statement's output was zeroed
    first. Those over single elements that ``flips`` computes transposed come last;
    the other terms follow in one ``+=`` of their sum."""
    whole = flips.node(lhs, rhs, made)
    if whole is not None:
        return whole
    reads = [a.tensor for e in (rhs, *(term for _, term in made.values())) for a in accesses(e)]
    steps = flips.restore(reads)
    own = tuple(i.single_variable for i in lhs.indices)
    terms = added_terms(rhs)
    into = [
        t for t in terms if isinstance(t, Access) and t.tensor in made and made[t.tensor][0] == own
    ]
    if None in own or len(set(own)) < len(own):
        into = []
    alone = [n for n in made if n not in {t.tensor for t in into}]
    steps += [f"{_lhs(n, made[n][0])} = {text(made[n][1])}" for n in alone]
    if not into:
        return [*steps, f"{lhs} = {text(rhs)}"]
    flipped = {t.tensor: flips.flipped(lhs, made[t.tensor][1]) for t in into}
    plain = [t for t in into if flipped[t.tensor] is None]
    for k, t in enumerate(plain):
        steps.append(f"{lhs} {'+=' if k else '='} {text(made[t.tensor][1])}")
    products = [flipped[t.tensor] for t in into if flipped[t.tensor] is not None]
    if products:
        steps.extend(flips.steps(lhs, "+=" if plain else "=", products))
    rest = [t for t in terms if not any(t is u for u in into)]
    if rest:
        steps.append(f"{lhs} += {text(sum_of(rest))}")
    return steps


def _fused(program: Graph) -> dict[str, tuple[Access, Expr]]:
    """The statements ``U(t,h) = f(T(t,h))`` with ``f`` in ``FUSED`` that the one statement
    reading ``U`` computes in place of reading it, by ``U``: their left side and ``f(T)``.
    Only where each term the reader adds up that reads ``U`` is linear in it (``Y = U · W
    + B``: each element of ``U`` read once per product, as ``U`` itself would be) and
    ``U`` is not an output."""
    fused = {}
    for node in program.nodes:
        rhs, lhs = node.statement.rhs, node.statement.lhs
        arg = fused_operand(rhs)
        if arg is None or arg is rhs or node.output in program.outputs:
            continue
        if any(i.single_variable not in node.out_vars for i in arg.indices):
            continue
        readers = [n for n in program.nodes if node.output in n.inputs]
        if len(readers) == 1 and all(
            linear_in(term, node.output)
            for term in added_terms(readers[0].statement.rhs, "+-")
            if any(a.tensor == node.output for a in accesses(term))
        ):
            fused[node.output] = (lhs, rhs)
    return fused


def _inlined(e: Expr, fused: Mapping[str, tuple[Access, Expr]]) -> Expr:
    """``e`` with each read of a ``fused`` tensor replaced by the function it holds, its
    indices renamed to the read's."""

    def read(a: Access) -> Expr:
        if a.tensor not in fused:
            return a
        lhs, rhs = fused[a.tensor]
        at = dict(zip((i.single_variable for i in lhs.indices), a.indices, strict=True))
        inner = fused_operand(rhs)
        moved = Access(inner.tensor, tuple(at[i.single_variable] for i in inner.indices))
        return replace(rhs, args=(moved,))

    return map_accesses(e, read)


def _lhs(name: str, indices: tuple[str, ...]) -> str:
    return f"{name}({', '.join(indices)})" if indices else name


def _rows_summed(program: Graph, name: str) -> bool:
    """Whether every read of ``name`` sums its first index away and keeps its second
    (``W(d,h)`` in ``T(t,h) = X(t,d) * W(d,h)``)."""
    reads = [
        (a, node.out_vars)
        for node in program.nodes
        for a in node.statement.rhs._accesses
        if a.tensor == name
    ]
    return bool(reads) and all(
        a.indices[0].single_variable not in out and a.indices[1].single_variable in out
        for a, out in reads
    )


def _parts(
    name: str, bits: np.ndarray, costs: Mapping[tuple[int, ...], float], taken: set[str]
) -> list[Part]:
    """The parts of one operand: per width, the blocks of each shape its cover chose.
    An element that blocks of two shapes cover goes to the block chosen first."""
    parts = []
    for width in np.unique(bits[bits > 0]):
        left = bits == width
        blocks, _ = block_cover(left, costs)
        masks: dict[tuple[int, ...], np.ndarray] = {}
        for shape, origin in blocks:
            window = tuple(slice(o, o + b) for o, b in zip(origin, shape, strict=True))
            mask = masks.setdefault(shape, np.zeros_like(left))
            mask[window] |= left[window]
            left[window] = False
        for shape, mask in masks.items():
            part = take_fresh(f"{name}_{width}b_{shape[0]}x{shape[1]}", taken)
            parts.append(Part(part, name, int(width), shape, mask))
    return parts
