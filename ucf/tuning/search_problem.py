"""What a statement and its formats offer a schedule search: the ``Problem`` that
``ucf.tuning.space`` draws trials from. Its loop variables and which are summed, the
loop orders that walk every sparse operand as stored, the workspaces a sub-product
(or a sum of products) may be gathered in, and which loops walk nonzeros. Built once
per choice of formats, picklable so worker processes rebuild nothing; the trials'
parameters and their spelling as schedule text are ``ucf.tuning.space``'s."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ucf.cin.blocking import unblock
from ucf.errors import UcfError
from ucf.format.format import Format
from ucf.lang.ast import Access, Binary, accesses, text
from ucf.lang.parser import parse_statement
from ucf.lang.reductions import peel
from ucf.schedule import storage_order
from ucf.schedule.gathering import gathering, terms

#: Loop orders offered at most (the default's first); beyond this, permutations are cut.
MAX_ORDERS = 120
PARALLEL = ("none", "loop", "chunk")
NNZ = "nnz"


@dataclass(frozen=True)
class Workspace:
    """A candidate ``precompute``: the sub-product (or sum of products), its variable,
    and the variables of the sub-product and of the rest of the statement (which decide
    where it can go). ``expr`` may join several expressions with `` & ``: one workspace
    each, over the same variable (the terms of a sum of products, apart)."""

    expr: str
    var: str
    inside: frozenset[str]
    outside: frozenset[str]


@dataclass(frozen=True)
class Problem:
    """What the space is built from: picklable, so worker processes rebuild nothing."""

    variables: tuple[str, ...]
    outputs: tuple[str, ...]
    reductions: tuple[str, ...]
    orders: tuple[tuple[str, ...], ...]  # loop orders, the default's first
    base: tuple[tuple[str, ...], tuple[str, ...]]  # unscheduled order: without/with workspace
    extents: dict[str, int]
    sparse: dict[str, tuple[tuple[str, ...], tuple[bool, ...]]]  # tensor -> level vars, full
    sparse_output: bool
    appended: frozenset[str]  # output variables a sparse output appends (never parallel)
    workspaces: tuple[Workspace, ...]
    converts: bool  # the default order converts an operand (it walks one against its storage)
    taken: frozenset[str] = field(default_factory=frozenset)  # names a new variable may not use
    places: frozenset[str] = field(default_factory=frozenset)  # loops over a block's places

    @property
    def parallel(self) -> tuple[str, ...]:
        return PARALLEL + ((NNZ,) if any(self.fusable(o) for o in self.orders) else ())

    @property
    def row(self) -> str | None:
        """The innermost loop of ucf's own order when it is an output variable: the row
        a register tile runs along (SpMM's ``k``)."""
        order = self.base[0]
        return order[-1] if order and order[-1] in self.outputs else None

    @property
    def positional(self) -> set[str]:
        """Variables some sparse operand stores in a level with positions: their loops
        walk nonzeros, so they cannot be bounded."""
        return {
            v
            for levels, full in self.sparse.values()
            for v, f in zip(levels, full, strict=True)
            if not f
        }

    def fusable(self, order: tuple[str, ...]) -> str | None:
        """A sparse operand whose two levels store the two outer loops of ``order``, the
        deeper one with positions (so ``fuse`` + ``pos`` walks its nonzeros), or None.
        A sparse output cannot be appended from such a loop."""
        if len(order) < 2 or self.sparse_output:
            return None
        for name, (levels, full) in self.sparse.items():
            for k in range(len(levels) - 1):
                if levels[k : k + 2] == order[:2] and not full[k + 1]:
                    return name
        return None

    def placeable(self, order: tuple[str, ...]) -> list[str]:
        """The workspaces that have a place in ``order``: a depth below which the
        sub-product and the rest share no loop but the workspace's (with a sparse
        output, below which every summed variable is the sub-product's), and above
        which no loop is ``wasteful``."""
        found: list[str] = []
        if self.converts and order == self.orders[0]:
            return found  # with a workspace, ucf chooses an order that converts nothing
        positional = self.positional
        for w in self.workspaces:
            for d in range(len(order)):
                below = set(order[d:])
                if w.var not in below or (w.inside & w.outside & below) - {w.var}:
                    continue
                if self.sparse_output and not set(self.reductions) <= below & w.inside:
                    continue
                if not any(self.wasteful(v, positional) for v in order[:d]):
                    found.append(f"{w.expr}@{w.var}")
                break  # deeper places have the same loops above them, and more
        return found

    def wasteful(self, v: str, positional: set[str]) -> bool:
        """Whether a loop over ``v`` around a workspace repeats its fill and drain for
        nothing: a summed variable (the output does not use it) whose loop runs its
        whole extent (no sparse operand stores it with positions). The workspace's own
        loop then repeats over its whole extent once per iteration, quadratic work: a
        CSC SpMM's ``w(i)`` under ``(j, k)`` is J*K*I where the statement does
        nnz*K. A summed loop over stored nonzeros (MTTKRP's ``k`` around ``w(j)``)
        costs what the rest of the statement costs there anyway."""
        return v in self.reductions and v not in positional


def problem(statement: str, formats: dict[str, Format], extents: dict[str, int]) -> Problem:
    """The search space of ``statement`` with tensors stored in ``formats``. Over a
    blocked format (``bcsr``) the kernel's loops are those of the split statement
    (``i_blk``, ``i_in``, ...; ``ucf.cin.blocking``), so the space is built on it; the
    loops over a block's places already have constant trip counts, so none is bounded."""
    from ucf.cin.concretize import concretize

    stmt = parse_statement(statement)
    every = [stmt.lhs, *accesses(stmt.rhs)]
    out = stmt.lhs.tensor
    fmts = {a.tensor: formats.get(a.tensor) or Format.dense(len(a.indices)) for a in every}
    places: frozenset[str] = frozenset()
    blocking = unblock(stmt, fmts)
    if blocking is not None:  # the kernel's loops are the split statement's: schedule those
        stmt, fmts = blocking.statement, dict(blocking.formats)
        every = [stmt.lhs, *accesses(stmt.rhs)]
        places = frozenset(inner for _, inner in blocking.names.values())
        if all(v in extents for v in blocking.sizes):
            extents = blocking.split_extents(dict(extents))
    outputs = tuple(i.single_variable for i in stmt.lhs.indices)
    variables = tuple(
        dict.fromkeys([*outputs, *(v for a in every for i in a.indices for v in i.variables)])
    )
    sparse = {}
    for a in every:
        fmt = fmts[a.tensor]
        chain = None if fmt.is_dense else storage_order.levels(a, fmt)
        if chain is not None:
            sparse[a.tensor] = (chain, tuple(k.full for k in fmt.levels))
    inputs = {n: f for n, f in fmts.items() if n != out}
    base = []
    gathered = gathering(stmt, fmts[out])
    for workspace in (False, True):
        try:
            relaxed = [gathered] if workspace and gathered else []
            cin = concretize(stmt, inputs, fmts[out], workspace=workspace, gathered=relaxed)
            base.append(tuple(cin.order))
        except UcfError:
            base.append(variables)
    chains = [lv for lv, _ in sparse.values()]
    orders = _orders(variables, chains, base[0])
    return Problem(
        variables=variables,
        outputs=outputs,
        reductions=tuple(v for v in variables if v not in outputs),
        orders=orders,
        base=(base[0], base[1]),
        extents=dict(extents),
        sparse=sparse,
        sparse_output=not fmts[out].is_dense,
        appended=frozenset(v for v, f in zip(*sparse.get(out, ((), ())), strict=True) if not f),
        workspaces=_workspaces(stmt, outputs),
        converts=not storage_order.walks_as_stored(base[0], chains),
        taken=frozenset({*variables, *(a.tensor for a in every)}),
        places=places,
    )


def _orders(variables, chains, default) -> tuple[tuple[str, ...], ...]:
    """The default order, then permutations that walk every sparse operand as stored
    (``storage_order.walks_as_stored``)."""

    found = [default]  # legal even when it converts an operand: ucf chose it
    for order in itertools.permutations(variables):
        if len(found) >= MAX_ORDERS:
            break
        if order != default and storage_order.walks_as_stored(order, chains):
            found.append(order)
    return tuple(found)


def _factors(e) -> list[Access] | None:
    if isinstance(e, Access):
        return [e]
    if isinstance(e, Binary) and e.op == "*":
        left, right = _factors(e.left), _factors(e.right)
        return None if left is None or right is None else left + right
    return None


def _variables(factors) -> frozenset[str]:
    return frozenset(v for a in factors for i in a.indices for v in i.variables)


def _workspaces(stmt, outputs: tuple[str, ...]) -> tuple[Workspace, ...]:
    """Every sub-product that uses an output variable, when the right-hand side is a
    product with something summed (else there is nothing for a workspace to gather);
    for a sum of products, the whole sum over an output variable every term uses, and
    its terms apart, one workspace each."""
    found_terms = terms(stmt.rhs)
    if found_terms is not None:
        spelled = [text(t) for _, t in found_terms]
        whole = spelled[0]
        for (sign, _), t in zip(found_terms[1:], spelled[1:], strict=True):
            whole += f" {'+' if sign > 0 else '-'} {t}"
        inside = _variables(accesses(stmt.rhs))
        out = []
        for v in outputs:
            if all(v in _variables(accesses(t)) for _, t in found_terms):
                outside = frozenset(outputs) | {v}
                out.append(Workspace(whole, v, inside, outside))
                out.append(Workspace(" & ".join(spelled), v, inside, outside))
        return tuple(out)
    summed, body = peel(stmt.rhs)
    factors = _factors(body)
    if not summed or not factors or len(factors) < 2:
        return ()
    found = []
    for v in outputs:
        for n in range(len(factors), 0, -1):
            for subset in itertools.combinations(factors, n):
                inside = _variables(subset)
                if v in inside:
                    rest = [f for f in factors if f not in subset]
                    outside = _variables(rest) | set(outputs)
                    found.append(Workspace("*".join(map(str, subset)), v, inside, outside))
    return tuple(found)
