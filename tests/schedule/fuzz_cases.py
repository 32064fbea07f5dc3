"""Random schedules over the classic sparse kernels, each case run in a worker subprocess.

One generator serves both ``tests/schedule/test_fuzz.py`` (a short,
derandomized hypothesis run) and ``bench/fuzz.py`` (the long run that writes
minimized repros).  It draws through the ``Draw`` interface of ``tests.fuzz_common``,
so hypothesis can shrink a failing case while the long run draws from a seeded
``random.Random``.

A case is plain data - kernel, formats, schedule text, target, extents,
densities and a data seed - so it crosses to a worker as JSON and prints as a
standalone repro.  The worker compiles and runs it and compares the result
with ``np.einsum`` on dense copies (``tests.fuzz_common.WorkerPool``: a worker that
dies is a "crash", one that stops answering a "hang").

The statements are sums of products whose reduction variables span each product,
so the reference does not depend on how ucf scopes sums inside larger expressions.
Some read a tensor under two index lists (``x(i)`` and ``x(j)``, ``D(i,j)`` and
``D(j,i)``, ``A(i,j) * A(j,k)``) or a repeated variable (``A(i,i)``). Formats are
random levels, aliases, blocked ones with unequal block sizes and ``nm(n,m)``; the
schedule is aimed at the loops of the statement the kernel runs (blocked variables
split into their block and place). Some cases instead make an operand dynamic or
run the kernel's statement as a TeSA plan (``tests.fuzz_plans``).

Allowed outcomes are the right answer or a ``ucf.UcfError`` that refuses the
case (not for a TeSA plan: one that ``transform`` returns must compile).
``ucf.CompileError`` is a failure here: it means the backend rejected
code ucf generated.  A schedule that asserts ``IgnoreRaces`` on a loop over a
reduction variable is the user's promise, not ucf's: such a case runs on one
thread, and a wrong answer under a ``CPUVector`` promise is reported as
"racy", not as a failure.
"""

from __future__ import annotations

import itertools
import os
import traceback
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from tests.fuzz_common import (  # noqa: F401  (WorkerPool and friends: this module's users')
    FAILURES,
    Draw,
    HypothesisDraw,
    Outcome,
    RandomDraw,
    WorkerPool,
    fit_nm,
    permutation,
)
from tests.fuzz_plans import draw_tesa, draw_tile, refusals, run_dynamic, run_tesa

# --------------------------------------------------------------------------- kernels


@dataclass
class FuzzKernel:
    """A statement, its operands' modes, and which operands are sparse.

    ``operands`` gives each tensor's index variables as it is first read (its modes,
    one letter each), ``terms`` the products the reference sums, each access as
    ``tensor:indices``, and ``same`` groups of variables that share one extent (those
    a tensor read twice, or its diagonal, ranges over)."""

    expr: str
    operands: dict[str, str]
    output: tuple[str, str]  # (name, index variables)
    terms: tuple[tuple[str, ...], ...]
    sparse: tuple[str, ...]  # operands that always get a sparse format
    sparse_output: float = 0.0  # how often the output gets a sparse format
    same: tuple[str, ...] = ()

    @property
    def variables(self) -> list[str]:
        out = self.output[1] + "".join(self.operands.values())
        return list(dict.fromkeys(out))

    @property
    def reductions(self) -> set[str]:
        return set(self.variables) - set(self.output[1])

    @property
    def read_once(self) -> list[str]:
        """The operands that one access reads (only those can be dynamic)."""
        reads = [a.split(":")[0] for term in self.terms for a in term]
        return [n for n in self.operands if reads.count(n) == 1]


def _terms(*products: str) -> tuple[tuple[str, ...], ...]:
    """``"A:ij x:j"`` -> ``(("A:ij", "x:j"),)``: one product per string."""
    return tuple(tuple(p.split()) for p in products)


KERNELS = {
    "SpMV": FuzzKernel(
        "y(i) = A(i,j) * x(j)", {"A": "ij", "x": "j"}, ("y", "i"), _terms("A:ij x:j"), ("A",)
    ),
    "SpMM": FuzzKernel(
        "C(i,k) = A(i,j) * B(j,k)",
        {"A": "ij", "B": "jk"},
        ("C", "ik"),
        _terms("A:ij B:jk"),
        ("A",),
    ),
    "SDDMM": FuzzKernel(
        "A(i,j) = B(i,j) * C(i,k) * D(k,j)",
        {"B": "ij", "C": "ik", "D": "kj"},
        ("A", "ij"),
        _terms("B:ij C:ik D:kj"),
        ("B",),
        0.3,
    ),
    "TTV": FuzzKernel(
        "A(i,j) = B(i,j,k) * c(k)",
        {"B": "ijk", "c": "k"},
        ("A", "ij"),
        _terms("B:ijk c:k"),
        ("B",),
        0.3,
    ),
    "MTTKRP": FuzzKernel(
        "A(i,j) = B(i,k,l) * C(k,j) * D(l,j)",
        {"B": "ikl", "C": "kj", "D": "lj"},
        ("A", "ij"),
        _terms("B:ikl C:kj D:lj"),
        ("B",),
    ),
    "SpGEMM": FuzzKernel(
        "C(i,j) = A(i,k) * B(k,j)",
        {"A": "ik", "B": "kj"},
        ("C", "ij"),
        _terms("A:ik B:kj"),
        ("A", "B"),
        0.7,
    ),
    "SpAdd": FuzzKernel(
        "C(i,j) = A(i,j) + B(i,j)",
        {"A": "ij", "B": "ij"},
        ("C", "ij"),
        _terms("A:ij", "B:ij"),
        ("A",),
        0.5,
    ),
    # a tensor read under two index lists, beside a sparse (maybe blocked) operand
    "SpMVx": FuzzKernel(
        "y(i) = A(i,j) * x(j) + x(i)",
        {"A": "ij", "x": "j"},
        ("y", "i"),
        _terms("A:ij x:j", "x:i"),
        ("A",),
        same=("ij",),
    ),
    "xAx": FuzzKernel(
        "s = A(i,j) * x(i) * x(j)",
        {"A": "ij", "x": "i"},
        ("s", ""),
        _terms("A:ij x:i x:j"),
        ("A",),
        same=("ij",),
    ),
    "DDt": FuzzKernel(
        "C(i,j) = A(i,j) + D(i,j) * D(j,i)",
        {"A": "ij", "D": "ij"},
        ("C", "ij"),
        _terms("A:ij", "D:ij D:ji"),
        ("A",),
        0.3,
        same=("ij",),
    ),
    "AA": FuzzKernel(
        "C(i,k) = A(i,j) * A(j,k)",
        {"A": "ij"},
        ("C", "ik"),
        _terms("A:ij A:jk"),
        ("A",),
        0.3,
        same=("ijk",),
    ),
    # a term without j before two SpMVs: the sum over j spans all three (the smallest
    # additive term holding both products is the whole right-hand side), so c(i) counts
    # once per j (the statement fuzzer, seed 71 case 311)
    "SpMV2": FuzzKernel(
        "y(i) = c(i) + A(i,j) * x(j) + B(i,j) * x(j)",
        {"c": "i", "A": "ij", "x": "j", "B": "ij"},
        ("y", "i"),
        _terms("c:i", "A:ij x:j", "B:ij x:j"),
        ("A", "B"),
    ),
    # a repeated variable in a sparse operand
    "Diag": FuzzKernel(
        "y(i) = A(i,i) * x(i) + A(i,j) * x(j)",
        {"A": "ij", "x": "j"},
        ("y", "i"),
        _terms("A:ii x:i", "A:ij x:j"),
        ("A",),
        same=("ij",),
    ),
    "Diag3": FuzzKernel(
        "Y(i,j) = B(i,j,i) * c(j)",
        {"B": "ijk", "c": "j"},
        ("Y", "ij"),
        _terms("B:iji c:j"),
        ("B",),
        0.3,
        same=("ik",),
    ),
}

ALIASES = {1: (), 2: ("csr", "csc", "dcsr", "dcsc", "coo"), 3: ("csf", "coo")}
EXTENTS = (3, 1, 2, 4, 5, 6, 7, 9, 17)
#: Now and then a case is large enough that parallel loops really overlap.
LARGE_EXTENTS = (24, 40, 64)
DENSITIES = (0.3, 0.0, 0.6, 1.0)
#: How often an operand's last level is fixed-width (ELL-like, ``F<w>``).
FIXED_WIDTH = 0.15
#: How often an operand of order 2 is blocked (``bcsr(2,3)``: unequal sizes too), and
#: one of order 2 or 3 is ``nm(n,m)``.
BLOCKED = 0.15
NM = 0.1
#: How often a case makes an operand dynamic, or runs as a TeSA plan, instead.
DYNAMIC = 0.06
TESA = 0.06
#: How often a case takes no schedule (the default model picks one per call).
DEFAULT = 0.15
FACTORS = (2, 3, 4, 1, 7, 8, 16)
STRATEGIES = ("NoRaces", "Atomics", "Temporary", "ParallelReduction", "IgnoreRaces")
#: Vector lanes cannot add atomically, a refusal tests/schedule/test_commands.py covers.
VECTOR_STRATEGIES = ("NoRaces", "ParallelReduction", "IgnoreRaces", "Temporary")
#: Command kinds, repeated to weight the draw; the first is what hypothesis shrinks to.
COMMANDS = (
    "split",
    "reorder",
    "split",
    "parallelize",
    "pos",
    "fuse",
    "divide",
    "bound",
    "unroll",
    "precompute",
    "branchless",
    "streams",
)
MAX_COMMANDS = 6
WORKSPACES = ("w", "w2")  # up to two precomputes per schedule


# --------------------------------------------------------------------------- drawing


def cases(targets: Sequence[str] = ("llvm",), kernels: Sequence[str] = tuple(KERNELS)):
    """A hypothesis strategy of cases."""
    from hypothesis import strategies as st

    @st.composite
    def strategy(draw):
        return draw_case(HypothesisDraw(draw), targets, kernels)

    return strategy()


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    kernel: str
    formats: dict[str, str]  # operands and output; a tensor not named is dense
    schedule: str
    target: str
    extents: dict[str, int]
    densities: dict[str, float]  # per sparse operand; dense operands are full
    seed: int
    races: list[str] = field(default_factory=list)  # units IgnoreRaces is asserted on
    dynamic: dict | None = None  # fuzz_plans.run_dynamic's spec
    tesa: dict | None = None  # fuzz_plans.draw_tesa's spec

    @property
    def statement(self) -> str:
        return KERNELS[self.kernel].expr

    @property
    def group(self) -> str:
        """The long run's summary row: the kernel, or the kind of a plan case."""
        return "tesa" if self.tesa else "dynamic" if self.dynamic else self.kernel


def draw_case(d: Draw, targets: Sequence[str], kernels: Sequence[str] = tuple(KERNELS)) -> Case:
    name = d.choice(kernels)
    kernel = KERNELS[name]
    formats: dict[str, str] = {}
    densities: dict[str, float] = {}
    for op, idx in kernel.operands.items():
        if op in kernel.sparse or d.boolean(0.2):
            formats[op] = draw_format(d, len(idx), operand=True)
            densities[op] = d.choice(DENSITIES)
    out, out_idx = kernel.output
    if kernel.sparse_output and d.boolean(kernel.sparse_output):
        formats[out] = draw_format(d, len(out_idx))
    sizes = LARGE_EXTENTS if d.boolean(0.1) else EXTENTS
    extents = {v: d.choice(sizes) for v in kernel.variables}
    for group in kernel.same:
        extents.update(dict.fromkeys(group, extents[group[0]]))
    for op, text in formats.items():
        letters, _, modes = text.partition(":")
        if letters.endswith("F"):  # a width up to the extent of the mode it stores
            last = kernel.operands[op][int(modes.split(",")[-1])]
            formats[op] = f"{letters}{d.integer(1, extents[last])}:{modes}"
    target = d.choice(targets)
    seed = d.integer(0, 2**16)
    kind = d.integer(0, 99)
    if kind < 100 * DYNAMIC and kernel.read_once:
        op = d.choice(kernel.read_once)
        formats.pop(op, None)
        densities.pop(op, None)
        tile = draw_tile(d, len(kernel.operands[op]))
        spec = {"name": op, "tile": tile, "mask": seed + 1, "density": d.choice(DENSITIES)}
        return Case(name, formats, "", target, extents, densities, seed, dynamic=spec)
    if kind >= 100 - 100 * TESA:
        shapes = {op: tuple(extents[v] for v in idx) for op, idx in kernel.operands.items()}
        return Case(name, {}, "", target, extents, {}, seed, tesa=draw_tesa(d, shapes))
    if d.boolean(DEFAULT):  # the default model's schedule, for the same shapes
        return Case(name, formats, "", target, extents, densities, seed)
    schedule, races = draw_schedule(d, kernel, formats, extents)
    return Case(name, formats, schedule, target, extents, densities, seed, races)


def draw_format(d: Draw, order: int, operand: bool = False) -> str:
    """An alias, or level letters (U, C, and S below C or S) with a mode ordering; an
    operand's last level may be fixed-width (``F``, its width drawn with the extents),
    and an operand may be blocked (its two block sizes drawn apart) or ``nm(n,m)``."""
    if operand and order == 2 and d.boolean(BLOCKED):
        kind = d.choice(("bcsr", "bcsc", "bdcsr"))
        return f"{kind}({d.choice((2, 1, 3, 4))},{d.choice((3, 1, 2, 4))})"
    if operand and order in (2, 3) and d.boolean(NM):
        m = d.choice((4, 2, 3))
        return f"nm({d.integer(1, m)},{m})"
    if ALIASES[order] and d.boolean(0.4):
        return d.choice(ALIASES[order])
    letters = ""
    for lvl in range(order):
        kinds = "CUS" if lvl and letters[-1] in "CS" else "CU"
        letters += d.choice(kinds)
    if operand and d.boolean(FIXED_WIDTH):
        letters = letters[:-1] + "F"
    modes = permutation(d, list(range(order)))
    return f"{letters}:{','.join(map(str, modes))}"


def fit_width(a: np.ndarray, text: str) -> np.ndarray:
    """``a`` with each segment of a last, fixed-width level cut to its first w nonzeros."""
    import ucf

    fmt = ucf.parse_format(text, order=a.ndim)
    width = getattr(fmt.levels[-1], "width", 0) if fmt.levels else 0
    if not width:
        return a
    t = np.transpose(a, fmt.mode_order).copy()
    rows = t.reshape(-1, t.shape[-1])
    rows[np.cumsum(rows != 0, axis=1) > width] = 0
    return np.ascontiguousarray(np.transpose(t, np.argsort(fmt.mode_order)))


class _Loops:
    """The loop variables as the schedule so far leaves them, with their origins."""

    def __init__(self, order: list[str]):
        self.loops = list(order)
        self.parents: dict[str, tuple[str, tuple[str, ...]]] = {}  # derived -> (kind, parents)
        self.used = set(order)

    def origins(self, v: str) -> list[str]:
        if v not in self.parents:
            return [v]
        out: list[str] = []
        for p in self.parents[v][1]:
            out += [o for o in self.origins(p) if o not in out]
        return out

    def kind(self, v: str) -> str:
        return self.parents[v][0] if v in self.parents else ""

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def replace(self, old: list[str], new: dict[str, str]) -> None:
        """Put the loops ``new`` (name -> how it derives from ``old``) in place of ``old``."""
        at = self.loops.index(old[0])
        self.loops[at : at + len(old)] = list(new)
        for v, kind in new.items():
            self.parents[v] = (kind, tuple(old))


@dataclass
class _Statement:
    """The statement a kernel runs, as its schedule names it: blocked variables split
    into their block and place (``i_blk``, ``i_in``), a tensor read in two splits
    seen twice (``x_v2``), a repeated variable offset (``i + i_d``)."""

    reads: dict[str, set[str]]  # tensor -> the variables of its accesses
    accesses: list[str]  # the accesses' text, for precompute's expressions
    levels: dict[str, list[tuple[str, str]]]  # sparse tensor -> (variable, letter) per level
    order: list[str]  # ucf's own default loop order
    extents: dict[str, int]
    reductions: set[str]


def _statement(kernel: FuzzKernel, formats: dict[str, str], extents: dict[str, int]) -> _Statement:
    import ucf
    from ucf.format.format import parse_formats
    from ucf.lang.ast import accesses, statement_orders
    from ucf.lang.parser import parse_statement
    from ucf.pipeline import _Front

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an operand no order follows is converted
            orders = statement_orders(parse_statement(kernel.expr))
            front = _Front(kernel.expr, parse_formats(formats, orders))
            order = list(front.concretized().order)
    except ucf.UcfError:  # the compile will say why; aim at the statement as written
        front, order = None, kernel.variables
    if front is None:
        tensors = {**kernel.operands, kernel.output[0]: kernel.output[1]}
        levels = {}
        for name, text in formats.items():
            fmt = ucf.parse_format(text, order=len(tensors[name]))
            if not fmt.is_dense:
                idx = tensors[name]
                pairs = zip(fmt.mode_order, fmt.levels, strict=True)
                levels[name] = [(idx[m], k.letter) for m, k in pairs]
        reads = {n: set(i) for n, i in kernel.operands.items()}
        text = [f"{n}({','.join(i)})" for n, i in kernel.operands.items()]
        return _Statement(reads, text, levels, order, dict(extents), kernel.reductions)
    stmt = front.stmt
    split = front.blocking.split_extents(extents) if front.blocking else dict(extents)
    split.update(dict.fromkeys(front.diagonals, 1))
    position = {v: k for k, v in enumerate(order)}
    fmts = {**front.fmts, stmt.lhs.tensor: front.computed}
    reads: dict[str, set[str]] = {}
    levels: dict[str, list[tuple[str, str]]] = {}
    for a in [stmt.lhs, *accesses(stmt.rhs)]:
        fmt = fmts[a.tensor]
        if a is not stmt.lhs:
            reads.setdefault(a.tensor, set()).update(v for i in a.indices for v in i.variables)
        if not fmt.is_dense:
            bases = [a.indices[m].base(position) for m in fmt.mode_order]
            levels[a.tensor] = [(v, k.letter) for v, k in zip(bases, fmt.levels, strict=True)]
    out = {i.single_variable for i in stmt.lhs.indices}
    text = [str(a).replace(" ", "") for a in accesses(stmt.rhs)]
    return _Statement(reads, text, levels, order, split, set(order) - out)


def _legal_order(d: Draw, nest: _Loops, levels: dict[str, list[tuple[str, str]]]) -> list[str]:
    """A random order of the current loops that walks every sparse tensor in level order."""
    before = {(a[0], b[0]) for lv in levels.values() for a, b in zip(lv, lv[1:], strict=False)}
    rest = list(nest.loops)
    out = []
    while rest:
        free = [
            v
            for v in rest
            if not any(
                (a, b) in before
                for u in rest
                if u != v
                for a in nest.origins(u)
                for b in nest.origins(v)
            )
        ]
        v = d.choice(free or rest)
        out.append(v)
        rest.remove(v)
    return out


def _grouped(accesses: list[str], terms: tuple[tuple[str, ...], ...]) -> list[list[str]]:
    """The accesses' texts per term of the sum (a kernel's statement lists its terms in
    the order of ``terms``); one group when a blocked read changed their number."""
    if len(accesses) != sum(map(len, terms)):
        return [accesses]
    at = [0, *itertools.accumulate(map(len, terms))]
    return [accesses[a:b] for a, b in itertools.pairwise(at)]


def _variables(access: str) -> set[str]:
    """The index variables in an access's text (``A(i_blk,i_in+i_d)``)."""
    inside = access[access.index("(") + 1 : -1] if "(" in access else ""
    return {w for w in inside.replace("+", ",").replace("-", ",").split(",") if w.isidentifier()}


#: How a derived loop relates to its parents, for the loops whose trip count is known.
BOUNDED = ("split-inner", "divide-outer", "bound")


def draw_schedule(
    d: Draw, kernel: FuzzKernel, formats: dict[str, str], extents: dict[str, int]
) -> tuple[str, list[str]]:
    """Schedule text aimed at the loops as each command leaves them, and the units on
    which it asserts IgnoreRaces over a reduction variable.

    Commands are aimed to be legal more often than not (pos at a compressed
    level, unroll of a bounded loop, orders that follow the sparse tensors),
    but every choice can also miss, so refusals are exercised too.
    """
    runs = _statement(kernel, formats, extents)
    levels, extents = runs.levels, runs.extents
    nest = _Loops(runs.order)
    commands: list[str] = []
    races: set[str] = set()
    precomputes = 0

    def positions(v: str) -> list[str]:
        """Operands with a compressed or singleton level for ``v``'s last origin."""
        origins = nest.origins(v)
        return [
            t
            for t, idx in runs.reads.items()
            if set(origins) <= idx and t in levels and (origins[-1], "U") not in levels[t]
        ]

    def pos(v: str) -> None:
        owners = positions(v)
        if d.boolean(0.05):
            owners = list(runs.reads)
        if not owners:
            return
        tensor = d.choice(owners)
        vpos = nest.fresh(f"{v}p")
        nest.replace([v], {vpos: "pos"})
        commands.append(f"pos({v}, {vpos}, {tensor})")

    wanted = d.integer(1, MAX_COMMANDS)

    def parallelize() -> None:
        v = d.choice(nest.loops)
        unit = d.choice(("CPUThread", "CPUVector"))
        strategy = d.choice(STRATEGIES if unit == "CPUThread" else VECTOR_STRATEGIES)
        if strategy == "IgnoreRaces" and set(nest.origins(v)) & runs.reductions:
            races.add(unit)
        commands.append(f"parallelize({v}, {unit}, {strategy})")

    for _ in range(3 * wanted):  # a draw that fits no loop adds nothing
        if len(commands) >= wanted:
            break
        kind = d.choice(COMMANDS)
        loops = nest.loops
        if kind == "reorder":
            order = _legal_order(d, nest, levels) if d.boolean(0.8) else permutation(d, loops)
            nest.loops = order
            commands.append(f"reorder({', '.join(order)})")
        elif kind in ("split", "divide"):
            v = d.choice(loops)
            factor = d.choice(FACTORS)
            outer, inner = nest.fresh(f"{v}0"), nest.fresh(f"{v}1")
            nest.replace([v], {outer: f"{kind}-outer", inner: f"{kind}-inner"})
            commands.append(f"{kind}({v}, {outer}, {inner}, {factor})")
        elif kind == "fuse" and len(loops) > 1:
            k = d.integer(0, len(loops) - 2)
            i, j = loops[k], loops[k + 1]
            f = nest.fresh("f")
            nest.replace([i, j], {f: "fuse"})
            commands.append(f"fuse({i}, {j}, {f})")
            if d.boolean(0.7):
                pos(f)
        elif kind == "pos":
            candidates = [v for v in loops if nest.kind(v) in ("", "fuse")]
            if candidates:
                pos(d.choice(candidates))
        elif kind == "bound":
            candidates = [v for v in loops if v not in nest.parents]
            if not candidates:
                continue
            v = d.choice(candidates)
            n = extents[v] + 1 if d.boolean(0.1) else extents[v]
            vb = nest.fresh(f"{v}b")
            nest.replace([v], {vb: "bound"})
            commands.append(f"bound({v}, {vb}, {n}, MaxExact)")
        elif kind == "unroll":
            bounded = [v for v in loops if nest.kind(v) in BOUNDED]
            if d.boolean(0.05):
                bounded = loops
            if not bounded:
                continue
            v = d.choice(bounded)
            commands.append(f"unroll({v}, {d.choice((2, 4, 3))})")
        elif kind == "branchless":  # a no-op unless the loop is a short sum
            commands.append(f"branchless({d.choice(loops)}, {d.choice((2, 4, 8))})")
        elif kind == "streams":  # a no-op unless the loop walks a row's positions
            commands.append(f"streams({d.choice(loops)}, {d.choice((1, 2))})")
        elif kind == "precompute" and precomputes < len(WORKSPACES):
            precomputes += 1
            ops = runs.accesses
            terms = _grouped(ops, kernel.terms)
            if len(terms) > 1 and d.boolean(0.4):  # whole terms of the sum, into one workspace
                chosen = [t for t in terms if d.boolean(0.5)] or terms[:1]
                used = set.intersection(*({v for op in t for v in _variables(op)} for t in chosen))
                expr = " + ".join("*".join(t) for t in chosen)
            else:  # some factors of a product
                taken = [op for op in ops if d.boolean(0.6)] or ops[:1]
                used = {v for op in taken for v in _variables(op)}
                expr = "*".join(taken)
            candidates = [
                v for v in loops if len(nest.origins(v)) == 1 and nest.origins(v)[0] in used
            ]
            if not candidates:
                continue
            v = d.choice(candidates)
            vw = v
            if d.boolean(0.3):
                vw = nest.fresh(f"{v}w")
                nest.replace([v], {vw: "workspace"})
            ws = WORKSPACES[precomputes - 1]
            commands.append(f"precompute({expr}, {v}, {vw}, {ws})")
        elif kind == "parallelize":
            parallelize()
    # Most parallelize commands come last, where they name loops of the final nest.
    if d.boolean(0.6):
        parallelize()
    return "; ".join(commands), sorted(races)


# --------------------------------------------------------------------------- running


def case_arrays(case: Case) -> dict[str, np.ndarray]:
    """The operands as dense arrays of small nonzero integers: every sum is exact."""
    from tests.helpers import rand_dense, rand_sparse

    rng = np.random.default_rng(case.seed)
    arrays = {}
    for op, idx in KERNELS[case.kernel].operands.items():
        shape = tuple(case.extents[v] for v in idx)
        if op in case.densities:
            a = rand_sparse(rng, shape, case.densities[op], empty_rows=0)
            fmt = case.formats[op]
            arrays[op] = fit_nm(fmt, a) if fmt.startswith("nm(") else fit_width(a, fmt)
        else:
            arrays[op] = rand_dense(rng, shape)
    return arrays


def reference(kernel: FuzzKernel, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """The sum of the kernel's products, by np.einsum on dense copies (a repeated
    index takes the diagonal)."""
    total = None
    for term in kernel.terms:
        part = np.einsum(_spec(kernel, term), *(arrays[a.split(":")[0]] for a in term))
        part = part * _spread(kernel, term, arrays)
        total = part if total is None else total + part
    return total


def _spread(kernel: FuzzKernel, term: tuple[str, ...], arrays: dict[str, np.ndarray]) -> int:
    """How often a term is added. A variable is summed over the smallest additive term
    holding all of its occurrences (docs/language.md); in a sum of terms that is
    the prefix up to the last term reading it (``+`` groups to the left) once a term
    before that reads it too, so a term of that prefix not reading it counts once per
    value of it."""
    count, at = 1, kernel.terms.index(term)
    for v in kernel.reductions:
        holders = [k for k, t in enumerate(kernel.terms) if any(v in a.split(":")[1] for a in t)]
        if len(holders) > 1 and at < holders[-1] and at not in holders:
            first = kernel.terms[holders[0]]
            name, modes = next(a.split(":") for a in first if v in a.split(":")[1])
            count *= arrays[name].shape[modes.index(v)]
    return count


def _spec(kernel: FuzzKernel, term: tuple[str, ...]) -> str:
    return ",".join(a.split(":")[1] for a in term) + "->" + kernel.output[1]


def run_case(case: Case) -> Outcome:
    """Compile and run one case in this process, and judge the result."""
    import ucf

    kernel = KERNELS[case.kernel]
    arrays = case_arrays(case)
    want = reference(kernel, arrays)
    if "CPUThread" in case.races:
        ucf.set_num_threads(1)
    into = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ucf.ConversionWarning)
            if case.tesa:
                got, arrays, _ = run_tesa(kernel.expr, arrays, case.tesa, case.seed, case.target)
                want = reference(kernel, arrays)  # the plan's stored values
            elif case.dynamic:
                got, arrays = run_dynamic(
                    kernel.expr, case.formats, arrays, case.dynamic, case.target
                )
                want = reference(kernel, arrays)  # the dynamic operand times its mask
            else:
                got, into = _run_kernel(case, kernel, arrays)
    except ucf.CompileError as e:
        return Outcome("error", f"CompileError: {e}")
    except ucf.UcfError as e:
        # a plan transform returns compiles; a dynamic operand is refused only so
        if case.tesa or isinstance(e, ucf.InternalError):
            return Outcome("error", f"{type(e).__name__}: {e}")
        if case.dynamic and not isinstance(e, refusals()):
            return Outcome("error", f"{type(e).__name__}: {e}")
        return Outcome("refused", f"{type(e).__name__}: {e}")
    except Exception:
        return Outcome("error", traceback.format_exc())
    finally:
        if "CPUThread" in case.races:
            ucf.set_num_threads(THREADS)
    if isinstance(got, ucf.Tensor):
        try:
            got.validate()  # a sparse output's pos/crd must be well formed, not just sum right
        except ucf.FormatError as e:
            return Outcome("wrong", f"the output's storage is malformed: {e}")
        got = got.to_numpy()
    got = np.asarray(got)
    status = "racy" if "CPUVector" in case.races else "wrong"
    if got.shape != want.shape or not _close(got, want, kernel, arrays):
        return Outcome(status, f"got {got.tolist()}\nwant {want.tolist()}")
    if into is not None and not np.allclose(into, want):
        return Outcome(status, f"into out= full of NaN: got {into.tolist()}\nwant {want.tolist()}")
    return Outcome("ok")


def _close(got: np.ndarray, want: np.ndarray, kernel: FuzzKernel, arrays: dict) -> bool:
    """np.allclose, with the absolute tolerance scaled by the terms' magnitudes where a
    sum cancels: a TeSA plan's quantized parts multiply by their scales in float32, so
    an entry whose products cancel to 0.2 from terms of 100 carries their rounding
    (the schedule fuzzer: AA as a plan with 8-bit parts)."""
    if np.allclose(got, want):
        return True
    scale = reference(kernel, {n: np.abs(a) for n, a in arrays.items()})
    return bool(np.all(np.abs(got - want) <= 1e-8 + 1e-5 * np.maximum(np.abs(want), scale)))


def _run_kernel(case: Case, kernel: FuzzKernel, arrays: dict[str, np.ndarray]):
    """The kernel's result, and (dense outputs) its result into out= full of NaN."""
    import ucf

    k = ucf.compile(kernel.expr, formats=case.formats, schedule=case.schedule, target=case.target)
    ops = {
        n: ucf.from_numpy(a, format=case.formats[n]) if n in case.formats else a
        for n, a in arrays.items()
    }
    got = k(**ops)
    into = None
    if isinstance(got, np.ndarray) and got.ndim:
        # into a given output full of NaN: the kernel, or the call, must clear every
        # element it does not compute (ucf.lower.zeroing decides which of the two)
        into = np.full(got.shape, np.nan, got.dtype)
        k(**ops, out=into)
    return got, into


THREADS = int(os.environ.get("OMP_NUM_THREADS", "2"))


def repro(case: Case, outcome: Outcome | None = None) -> str:
    """A standalone script that runs the case (data inline) and checks it against numpy;
    a dynamic or TeSA case reruns through this module."""
    kernel = KERNELS[case.kernel]
    arrays = case_arrays(case)
    lines = [f"# {case.kernel} on target {case.target}, data seed {case.seed}"]
    if outcome is not None:
        lines += [f"# outcome: {outcome.status}"]
        lines += [f"#   {line}" for line in outcome.detail.strip().splitlines()[-12:]]
    if case.dynamic or case.tesa:
        from dataclasses import asdict

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        lines += [
            "import sys",
            f"sys.path[:0] = [{root!r}]",
            "from tests.schedule.fuzz_cases import Case, run_case",
            "",
            f"outcome = run_case(Case(**{asdict(case)!r}))",
            "assert outcome.status in ('ok', 'refused'), outcome",
            "",
        ]
        return "\n".join(lines)
    lines += ["import numpy as np", "", "import ucf", ""]
    if "CPUThread" in case.races:
        lines.append("ucf.set_num_threads(1)  # the schedule asserts IgnoreRaces over a reduction")
    lines.append("arrays = {")
    lines += [f"    {n!r}: np.array({a.tolist()!r})," for n, a in arrays.items()]
    lines += [
        "}",
        f"formats = {case.formats!r}",
        f"k = ucf.compile({kernel.expr!r}, formats=formats, schedule={case.schedule!r}, "
        f"target={case.target!r})",
        "ops = {n: ucf.from_numpy(a, format=formats[n]) if n in formats else a "
        "for n, a in arrays.items()}",
        "got = k(**ops).to_numpy()",
    ]
    parts = []
    for term in kernel.terms:
        names = ", ".join(f"arrays[{a.split(':')[0]!r}]" for a in term)
        parts.append(f"np.einsum({_spec(kernel, term)!r}, {names})")
    lines += [f"want = {' + '.join(parts)}", "assert np.allclose(got, want), (got, want)", ""]
    return "\n".join(lines)


def simpler(case: Case):
    """Candidate cases one step simpler than ``case`` (``bench/fuzz.py`` minimizes with
    them): a command dropped, target llvm, an operand dense, extents and densities
    smaller (a group of variables that share an extent together), seed 0."""
    commands = [c.strip() for c in case.schedule.split(";") if c.strip()]
    for k in range(len(commands)):
        yield replace(case, schedule="; ".join(commands[:k] + commands[k + 1 :]))
    if case.target != "llvm":
        yield replace(case, target="llvm")
    kernel = KERNELS[case.kernel]
    for name in case.formats:
        if name not in kernel.sparse and not case.tesa:
            formats = {n: f for n, f in case.formats.items() if n != name}
            densities = {n: x for n, x in case.densities.items() if n != name}
            yield replace(case, formats=formats, densities=densities)
    for v, e in case.extents.items():
        group = next((g for g in kernel.same if v in g), v)
        for smaller in sorted({1, 2, e // 2, e - 1}):
            if 1 <= smaller < e:
                yield replace(case, extents={**case.extents, **dict.fromkeys(group, smaller)})
    for name, x in case.densities.items():
        if x not in (0.0, 0.3):
            yield replace(case, densities={**case.densities, name: 0.3})
    if case.seed:
        yield replace(case, seed=0)
