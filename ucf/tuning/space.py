"""The schedules a tuner may try, derived from the statement and the formats.

Nothing here is written per kernel: the choices come from what the statement
says (its index variables, which of them are summed, the factors of a
product) and what the formats say (which operands are sparse and in which
order they store their modes). A trial picks, in define-by-run style:

- ``order``: ucf's own loop order, or one that walks every sparse operand (and
  a sparse output) in its storage order, so no operand is converted per call;
- ``precompute[<order>]``: a workspace for a sub-product over one output
  variable (Gustavson's SpGEMM, MTTKRP's row of ``B*D``), when something is
  summed and the order has a place for it (required where a sparse output
  would otherwise be appended inside a sum); for a sum of products (``A@B +
  D@E``), one workspace gathering every term, or one per term;
- ``bound_<v>``: a constant trip count for a dense extent of at most 64, or 256
  for the innermost output loop of ucf's order, the row a register tile runs
  along (a shape class keeps such extents exact, so the tuned plan is looked up
  only for them);
- ``parallel``: no parallel loop, one loop on threads, blocks of ``chunk``
  iterations on threads, or blocks of ``chunk`` nonzeros (``fuse`` + ``pos``
  over a sparse operand's two outer levels, else of the outer loop's
  iterations); ``depth`` picks the loop and ``strategy`` how a summed loop's
  writes are combined. A sparse output is built in parallel only over its
  dense levels, so other loops stay serial;
- ``tile_log2``: where the innermost loop is a bounded output variable under a
  summed loop (SpMM's ``k`` under ``j``), a tile of it (a power of two) moved
  above the summed loops, so the tile of the output stays in registers while
  they run (a register tile across N; without it each nonzero loads and stores
  the whole output row);
- ``inner_log2``: a split of the innermost loop (a power of two), which LLVM
  vectorizes by itself where it can (a ``CPUVector`` request that it cannot
  honour only prints a warning);
- ``format_<T>`` (``ucf.tuning.format_space``, when formats are searched too): each
  sparse input's format, among its level kinds and mode orders and the blocked
  and fixed-width formats its nonzeros' fill says can pay, and each dense
  input's mode order, its own or the one its loops walk; every choice of
  formats then has parameters of its own, named with a ``[T=...]`` suffix.

The result is schedule text; ucf's own checks decide whether it is legal,
and an illegal one is a pruned trial.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from ucf.cin.blocking import unblock
from ucf.errors import UcfError
from ucf.exec.tuned import EXACT_EXTENT
from ucf.format.format import Format
from ucf.lang.ast import Access, Binary, accesses, text
from ucf.lang.parser import parse_statement
from ucf.lang.reductions import peel
from ucf.schedule import storage_order
from ucf.schedule.commands import (
    BoundCommand,
    Command,
    Fuse,
    Parallelize,
    Pos,
    PrecomputeCommand,
    Reorder,
    SplitCommand,
)
from ucf.schedule.gathering import gathering, terms
from ucf.schedule.records import Parallel
from ucf.schedule.text import spelled

#: Loop orders offered at most (the default's first); beyond this, permutations are cut.
MAX_ORDERS = 120
#: Blocks of 2**2 .. 2**13 iterations or nonzeros per thread's turn.
CHUNK_LOG2 = (2, 13)
#: Inner splits of 2**1 .. 2**6 (0: none).
INNER_LOG2 = 6
#: Dense loops of at most this extent may be bound; the innermost output loop of ucf's
#: own order (SpMM's row of N) up to ``EXACT_EXTENT``, so that it can be register-tiled.
BOUND_EXTENT = 64
#: Register tiles of 2**3 .. 2**5 output entries (0: none).
TILE_LOG2 = (0, 3, 4, 5)
#: Changes whenever the parameters below change, so a study of an older space is not
#: resumed with incompatible choices.
SPACE_VERSION = 8
PARALLEL = ("none", "loop", "chunk")
NNZ = "nnz"
NONE = "none"


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


def _fresh(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name


@dataclass(frozen=True)
class _Scoped:
    """A trial whose parameter names end in ``scope``: each choice of input formats
    has a space of its own (its loop orders and workspaces differ)."""

    trial: Any
    scope: str

    def suggest_categorical(self, name: str, choices: list) -> Any:
        return self.trial.suggest_categorical(name + self.scope, choices)

    def suggest_int(self, name: str, low: int, high: int) -> int:
        return self.trial.suggest_int(name + self.scope, low, high)


def suggest(trial: Any, p: Problem, scope: str = "") -> list[Command]:
    """Ask ``trial`` (an optuna trial, or anything with its ``suggest_*`` methods) for
    one schedule of ``p``, with parameter names ending in ``scope``; its commands. Loop
    transformations come first and ``parallelize`` last, since it names loops of the
    final nest."""
    if scope:
        trial = _Scoped(trial, scope)
    spelled = trial.suggest_categorical("order", [",".join(o) for o in p.orders])
    order = tuple(spelled.split(","))
    places = p.placeable(order)
    if places and not _appends_inside_sum(p, order):
        places = [NONE, *places]
    pre = trial.suggest_categorical(f"precompute[{spelled}]", places) if places else NONE
    workspace = pre.rsplit("@", 1)[1] if pre != NONE else None
    taken = set(p.taken)
    label: dict[str, str | None] = {v: v for v in p.variables}
    steps: list[Command] = []
    parallel: list[Command] = []
    if order != p.base[pre != NONE]:
        steps.append(Reorder(order))
    if pre != NONE:
        for expr in pre.rsplit("@", 1)[0].split(" & "):
            ws = _fresh("w", taken)
            steps.append(PrecomputeCommand(expr, workspace, workspace, ws))
    positional = p.positional
    for v in p.variables:
        n = p.extents.get(v)
        # The innermost loop of ucf's order up to 256: SpMM's row of N, a register tile
        # runs along; SDDMM's dot product over k, whose constant trip count vectorizes.
        limit = EXACT_EXTENT if v in (p.row, p.base[0][-1]) else BOUND_EXTENT
        if n is None or n > limit or v in positional or v in p.places or v == workspace:
            continue
        if trial.suggest_categorical(f"bound_{v}", [False, True]):
            label[v] = _fresh(f"{v}b", taken)
            steps.append(BoundCommand(v, label[v], n))
    tiled = _tile(trial, p, order, label, taken, steps)
    kind = trial.suggest_categorical("parallel", list(p.parallel))
    chunk = 2 ** trial.suggest_int("chunk_log2", *CHUNK_LOG2) if kind in ("chunk", NNZ) else 0
    tensor = p.fusable(order) if kind == NNZ and workspace is None and not tiled else None
    if tensor is not None:
        f, fpos = _fresh("f", taken), _fresh("fpos", taken)
        outer, inner = _fresh(f"{fpos}0", taken), _fresh(f"{fpos}1", taken)
        steps += [
            Fuse(label[order[0]], label[order[1]], f),
            Pos(f, fpos, tensor),
            SplitCommand(fpos, outer, inner, chunk),
        ]
        parallel.append(_threads(outer, _strategy(trial, p, order[:2])))
        label[order[0]] = label[order[1]] = None
    elif kind != NONE:
        # Where no operand's nonzeros can be walked (or a workspace is in the way),
        # blocks of the outer loop's iterations instead; a workspace's own loop is not
        # split, but may run on threads whole. Either way no trial is wasted. A loop
        # that runs once (a batch of 1) is passed over: the choice is between the two
        # outermost loops that have something to share (a convolution's channels).
        shared = [u for u in order if p.extents.get(u, 2) > 1][:2] or [order[0]]
        depth = 0 if kind == NNZ or len(shared) < 2 else trial.suggest_int("depth", 0, 1)
        v = shared[depth]
        target = label[v]
        if p.sparse_output and (v in p.appended or v in p.reductions):
            kind = NONE  # a sparse output is built in parallel only over its dense levels
        elif kind != "loop" and v != workspace and chunk < p.extents.get(v, chunk + 1):
            outer, inner = _fresh(f"{v}0", taken), _fresh(f"{v}1", taken)
            steps.append(SplitCommand(target, outer, inner, chunk))
            target = outer
        if kind != NONE:
            parallel.append(_threads(target, _strategy(trial, p, (v,))))
            label[v] = None  # named by the parallelize, so no later split may rename it
    last = order[-1]
    if label[last] is not None and last != workspace:
        factor = 2 ** trial.suggest_int("inner_log2", 0, INNER_LOG2)
        if 1 < factor < p.extents.get(last, factor + 1):  # a split of one block is none
            outer, inner = _fresh(f"{last}o", taken), _fresh(f"{last}i", taken)
            steps.append(SplitCommand(label[last], outer, inner, factor))
            label[last] = inner
    return steps + parallel


def _threads(v: str, strategy: str) -> Command:
    return Parallelize(v, Parallel("CPUThread", strategy))


def _tile(trial: Any, p: Problem, order: tuple[str, ...], label, taken, steps) -> bool:
    """A register tile of the innermost loop, when it is a bounded output variable under
    summed loops: its outer part moves above them (``i, ko, j, ki`` for SpMM), so a
    tile of the output row is summed in registers over the row's nonzeros. Appends
    the steps and renames the loop; whether it tiled. Only a bounded loop: a tile with
    a run-time remainder is not unrolled, so its entries would stay in memory."""
    v = order[-1]
    sums = len(order) - 1
    while sums > 0 and order[sums - 1] in p.reductions:
        sums -= 1
    if v not in p.outputs or sums == len(order) - 1 or label[v] == v or p.sparse_output:
        return False
    size = 2 ** trial.suggest_categorical("tile_log2", list(TILE_LOG2))
    if size == 1 or size >= p.extents.get(v, 0):
        return False
    outer, inner = _fresh(f"{v}t", taken), _fresh(f"{v}r", taken)
    loops = [label[u] for u in order[:sums]] + [outer]
    loops += [label[u] for u in order[sums:-1]] + [inner]
    steps += [SplitCommand(label[v], outer, inner, size), Reorder(tuple(loops))]
    label[v] = None  # its split is done
    return True


def _appends_inside_sum(p: Problem, order: tuple[str, ...]) -> bool:
    """Whether ``order`` puts a summed loop outside an output variable of a sparse
    output: legal only with a workspace, so one must be chosen."""
    if not p.sparse_output:
        return False
    first_sum = min((order.index(v) for v in p.reductions), default=len(order))
    return any(order.index(v) > first_sum for v in p.outputs)


def _strategy(trial: Any, p: Problem, variables: tuple[str, ...]) -> str:
    """NoRaces over output variables; a summed loop's writes need combining."""
    if all(v in p.outputs for v in variables):
        return "NoRaces"
    return trial.suggest_categorical("strategy", ["Atomics", "Temporary"])


def default_params(p: Problem, scope: str = "") -> dict[str, Any]:
    """The parameters that spell ucf's default schedule (the outermost loop on threads
    when it is an output variable, else serial), tried first so the tuner starts from
    the default."""
    order, workspace = p.base[0], NONE
    places = p.placeable(p.base[1]) if p.converts else []
    if places:  # ucf's own workspace (Gustavson's), in the order that needs no conversion
        order, workspace = p.base[1], places[0]
    spelled = ",".join(order)
    params: dict[str, Any] = {
        "order": spelled,
        f"precompute[{spelled}]": workspace,
        "inner_log2": 0,
    }
    params.update({f"bound_{v}": False for v in p.variables})
    params["parallel"] = "loop" if order and order[0] in p.outputs else NONE
    params["depth"] = 0
    return {name + scope: value for name, value in params.items()}


#: Seed schedules' blocks of rows (log2): the hand schedules of ``bench/parallel.py``
#: that beat ucf's default (SpMM by 16 to 256 rows with N bound, SpMV by 512 to 8192).
SEED_CHUNKS = (8, 4, 11, 6, 13)
#: Seed schedules' register tile (log2): four AVX2 registers of float64, 1.25 to 1.5
#: times faster than the bound row alone for SpMM with N = 32 and 128 (one thread).
SEED_TILE = 4


def seed_params(p: Problem, threads: int, scope: str = "") -> list[dict[str, Any]]:
    """Parameters of schedules known to win somewhere, tried after the default so a short
    study does not depend on the sampler drawing them: every small dense loop bound (a
    constant trip count the compiler unrolls and vectorizes), first with a register tile
    of ``SEED_TILE`` entries where the space has one, and with ``threads`` > 1 the
    default order's outer loop on threads whole, in blocks of ``SEED_CHUNKS`` rows and
    in blocks of nonzeros, bound and not. Best-first, so a study cuts the tail."""
    base = default_params(p)
    order = tuple(base["order"].split(","))
    found: list[dict[str, Any]] = []
    for bound, tile in ((True, SEED_TILE), (True, 0), (False, 0)):
        common = {
            **base,
            **{f"bound_{v}": bound for v in p.variables},
            "strategy": "Atomics",
            "tile_log2": tile,
        }
        if threads > 1 and order and order[0] in p.outputs:
            found.append({**common, "parallel": "loop"})
            for c in SEED_CHUNKS:
                if CHUNK_LOG2[0] <= c <= CHUNK_LOG2[1] and 2**c < p.extents.get(order[0], 0):
                    found.append({**common, "parallel": "chunk", "chunk_log2": c})
            if NNZ in p.parallel and p.fusable(order):
                found.append({**common, "parallel": NNZ, "chunk_log2": CHUNK_LOG2[1]})
        if bound:
            found.append({**common, "parallel": NONE})
    texts = {spell(p, base)}
    unique = []
    for d in found:
        text = spell(p, d)
        if text not in texts:  # parameters that no question asks make no other schedule
            texts.add(text)
            unique.append({name + scope: value for name, value in d.items()})
    return unique


def spell(p: Problem, params: dict[str, Any]) -> str:
    """The schedule text that ``params`` (unscoped) spell in ``p``'s space."""
    return spelled(suggest(_Fixed(params), p))


@dataclass(frozen=True)
class _Fixed:
    """A trial that answers from ``params`` (the first choice where they say nothing):
    the schedule text a set of parameters spells."""

    params: dict[str, Any]

    def suggest_categorical(self, name: str, choices: list) -> Any:
        value = self.params.get(name, choices[0])
        return value if value in choices else choices[0]

    def suggest_int(self, name: str, low: int, high: int) -> int:
        return min(max(int(self.params.get(name, low)), low), high)
