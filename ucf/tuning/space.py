"""The schedules a tuner may try, derived from the statement and the formats.

Nothing here is written per kernel: the choices come from what the statement
says (its index variables, which of them are summed, the factors of a
product) and what the formats say (which operands are sparse and in which
order they store their modes), gathered in a ``Problem``
(``ucf.tuning.search_problem``). A trial picks, in define-by-run style:

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

from dataclasses import dataclass
from typing import Any

from ucf.exec.tuned import EXACT_EXTENT
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
from ucf.schedule.records import Parallel
from ucf.schedule.text import spelled
from ucf.tuning.search_problem import NNZ, Problem

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
NONE = "none"


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
