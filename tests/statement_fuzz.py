"""Differential fuzzing: random statements and formats against numpy.

One generator serves ``tests/test_fuzz.py`` (hypothesis, shrinking) and the long run
(``bench/fuzz.py --fuzzer statements``), drawing through the ``Draw`` interface of
``tests.fuzz_common``. A case is plain data (statement, formats, extents, a data seed),
so it crosses to a worker subprocess as JSON and prints as a repro.

Statements mix products, sums and differences of accesses, unary minus, literals,
element-wise functions and explicit ``sum``, ``max`` and ``min`` reductions (now and
then over an empty range: a variable of extent 0). A tensor may be read under several
index lists (``x(i)`` and ``x(j)``, ``D(i,j)`` and ``D(j,i)``, ``A(i,j) * A(j,k)``) or
the same one again (``A(i,j) * A(i,j)``, walked once),
and with a repeated variable (``A(i,i)``); formats are random U/C levels in a
random mode order, blocked per variable or per tensor (block sizes that disagree
between modes and between tensors), fixed-width, ``nm(n,m)``, or named blocked
formats. Sparse operands and outputs may read absent entries as a fill value
(``fill=-inf``, ``fill=inf``, ``fill=1``); now and then a fill lands on a blocked or
fixed-width format, which must be refused by name (``refused``). Some cases instead
make one operand dynamic (``fuzz_plans``) or run the statement as a TeSA plan.

Some cases are a clash: two operands whose fills both absorb the operator that joins
them and disagree on its value (``2*A(i) + B(i)`` with fills -inf and inf, ``A - B``
with the same infinity, ``A * B`` with 0 and an infinity, a ``max``/``min`` of two
infinities), under a ``max`` or ``min`` reduction. Where one operand alone is stored
the other's fill decides the term, which a loop that skips those coordinates gets
wrong (the wrong answer fixed in 3e9ff98). Where neither is stored IEEE arithmetic
makes NaN, and a NaN in a reduced range leaves the whole result uncompared, which is
what hid that bug from the random fills: so a clash's data stores one of the two
operands at every coordinate (``Case.cover``), or stores one of them everywhere, which
keeps the result finite where that one's fill would decide the reduction. Half the
clashes join a third operand, mostly stored in blocks, by ``+`` or ``-``
(``C(i) + (A(i) + B(i))``): a loop over blocks visits every block, and a case that does
nothing there once let its coordinates fall through to the case where neither clashing
operand matched (fills seed 139 case 676, tests/lang/test_fills.py).

The reference reads the reduction rule straight from its definition, on dense arrays
with numpy broadcasting: a variable missing from the output is summed over the
smallest additive term (the whole right-hand side, or an operand of ``+``/``-``)
that holds all of its occurrences; ``max``/``min`` over an empty range is the
reduction's identity (-inf, +inf), and an operand's absent entries hold its fill. For
sums of products a second reference, one ``np.einsum`` per term, checks the first.

Where a fill meets what IEEE arithmetic makes NaN of (``-inf * 0``, ``inf - inf``),
ucf's structural rule decides instead (docs/language.md: an absent 0 absorbs a
product, an infinity a sum); everywhere else the two agree, so elements the IEEE
reference holds NaN at are not compared.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

import numpy as np

from tests.fuzz_common import Draw, Outcome, fit_nm, permutation
from tests.fuzz_plans import draw_tesa, draw_tile, refusals, run_dynamic, run_tesa

VARS = ["i", "j", "k", "l"]
NAMES = ["A", "B", "C", "D"]
UNARY = ["relu", "abs", "sign", "tanh", "sin", "exp", "cos", "sigmoid"]
BINARY = ["max", "min"]
TRANSCENDENTAL = {"tanh", "sin", "exp", "cos", "sigmoid"}
LETTERS = "abcdefgh"
REDUCTIONS = ["sum", "max", "min"]
#: Fill values a sparse operand or output may read its absent entries as.
FILLS = [0.0, 0.0, 0.0, -np.inf, np.inf, 1.0]
#: What an empty range reduces to (docs/language.md).
IDENTITY = {"sum": 0.0, "max": -np.inf, "min": np.inf}

# A tree is ("acc", name, indices) | ("lit", value) | ("neg", t) | (op, left, right) for op
# in + - * | ("fn", name, (args...)) | (reduction, (vars...), body) for a reduction in
# REDUCTIONS.


@dataclass
class Case:
    expr: str
    tree: tuple
    tensors: dict[str, list[str]]  # each tensor's modes: the index list it is first read with
    out_vars: list[str]
    extents: dict[str, int]
    formats: dict[str, str]  # "" for dense; may end in " fill=<value>"
    out_format: str | None
    seed: int
    density: float
    target: str = "llvm"
    dynamic: dict | None = None  # fuzz_plans.run_dynamic's spec
    tesa: dict | None = None  # fuzz_plans.draw_tesa's spec
    cover: list[str] | None = None  # the last stored wherever none of the others is

    def __post_init__(self) -> None:
        self.tree = _tuples(self.tree)

    @property
    def mode(self) -> str:
        return "tesa" if self.tesa else "dynamic" if self.dynamic else "kernel"

    @property
    def group(self) -> str:
        """The long run's summary row."""
        return self.mode


def _tuples(x):
    return tuple(_tuples(y) for y in x) if isinstance(x, list | tuple) else x


def render(t) -> str:
    kind = t[0]
    if kind == "acc":
        return f"{t[1]}({','.join(t[2])})" if t[2] else t[1]
    if kind == "lit":
        return repr(t[1])
    if kind == "neg":
        return f"-({render(t[1])})"
    if kind == "fn":
        return f"{t[1]}({', '.join(render(a) for a in t[2])})"
    if kind in REDUCTIONS:
        return f"{kind}({', '.join(t[1])}, {render(t[2])})"
    op, left, right = t
    return f"({render(left)}) {op} ({render(right)})"


def subtrees(t):
    kind = t[0]
    if kind in ("acc", "lit"):
        return ()
    if kind == "neg":
        return (t[1],)
    if kind == "fn":
        return t[2]
    if kind in REDUCTIONS:
        return (t[2],)
    return (t[1], t[2])


def variables(t) -> set[str]:
    if t[0] == "acc":
        return set(t[2])
    return set().union(*(variables(c) for c in subtrees(t)))


def reductions(t) -> set[str]:
    """The explicit reductions (``sum``, ``max``, ``min``) a tree takes."""
    own = {t[0]} if t[0] in REDUCTIONS else set()
    return own.union(*(reductions(c) for c in subtrees(t)))


def leaves(t) -> list[tuple]:
    return [t] if t[0] == "acc" else [x for c in subtrees(t) for x in leaves(c)]


# --------------------------------------------------------------------------- drawing


def draw_tree(d: Draw, reads: list[tuple], functions: bool) -> tuple:
    if len(reads) == 1:
        leaf = ("acc", *reads[0])
        if d.integer(0, 5) == 0:
            leaf = ("*", ("lit", d.choice([2, -1, 0.5])), leaf)
        return leaf
    split = d.integer(1, len(reads) - 1)
    left, right = draw_tree(d, reads[:split], functions), draw_tree(d, reads[split:], functions)
    shape = d.integer(0, 9)
    if shape == 0 and functions:
        return ("fn", d.choice(BINARY), (left, right))
    t = (d.choice("+-*"), left, right)
    if shape == 1:
        t = ("neg", t)
    elif shape == 2 and functions:
        t = ("fn", d.choice(UNARY), (t,))
    return t


def add_reduction(d: Draw, tree: tuple, out_vars: list[str]) -> tuple:
    """Wrap one subtree in an explicit sum, max or min over variables used only inside it."""
    nodes = []

    def collect(t):
        nodes.append(t)
        for c in subtrees(t):
            collect(c)

    collect(tree)
    everywhere = [v for leaf in leaves(tree) for v in leaf[2]]

    def own_vars(t) -> list[str]:
        inside = [v for leaf in leaves(t) for v in leaf[2]]
        return sorted(
            v for v in set(inside) if v not in out_vars and inside.count(v) == everywhere.count(v)
        )

    candidates = [t for t in nodes if own_vars(t)]
    if not candidates:
        return tree
    target = d.choice(candidates)
    own = own_vars(target)
    picked = tuple(v for v in permutation(d, own)[: d.integer(1, len(own))])
    op = d.choice(REDUCTIONS)

    def rebuild(t):
        if t is target:
            return (op, picked, t)
        kind = t[0]
        if kind in ("acc", "lit"):
            return t
        if kind == "neg":
            return ("neg", rebuild(t[1]))
        if kind == "fn":
            return ("fn", t[1], tuple(rebuild(a) for a in t[2]))
        if kind in REDUCTIONS:
            return (kind, t[1], rebuild(t[2]))
        return (t[0], rebuild(t[1]), rebuild(t[2]))

    return rebuild(tree)


def random_format(
    d: Draw,
    order: int,
    blocks: tuple[int, ...] = (),
    fixed: bool = False,
    unordered: bool = False,
    singleton: bool = False,
) -> str:
    """U/C levels in a random mode order; a mode with a block size in ``blocks`` may be
    stored in blocks (its block among the outer levels, its place among the inner).
    ``fixed``: the last level may be fixed-width, written ``F`` until the data gives
    its width (:func:`fixed_width`). ``unordered``: it may be unordered (``Q``, an
    output's: appended in whatever order the kernel produces). ``singleton``: the
    levels below some level may be singletons (``S``), that level compressed and not
    unique, as COO stores (``CS``, ``UCS``, ``CSS``): a merge of such iterators runs a
    loop per lattice point, and ends them at different points (the one-body bug of
    the case budget hid there, since the fuzzer drew U and C only)."""
    if order == 0:
        return ""
    perm = permutation(d, list(range(order)))
    blocked = [m for m in perm if blocks and blocks[m] and d.boolean(0.5)]
    maps = [f"{m}/{blocks[m]}" if m in blocked else str(m) for m in perm]
    maps += [f"{m}%{blocks[m]}" for m in blocked]
    letters = "".join(d.choice("UC") for _ in maps)
    if singleton and len(maps) >= 2 and d.integer(0, 4) == 0:
        top = d.integer(1, len(maps) - 1)  # the first singleton level
        letters = letters[: top - 1] + "C" + "S" * (len(maps) - top)
    elif fixed and d.integer(0, 4) == 0:
        letters = letters[:-1] + "F"
    elif unordered and d.integer(0, 4) == 0:
        letters = letters[:-1] + "Q"
    return f"{letters}:{','.join(maps)}"


def draw_clash(d: Draw, vars_: list[str]) -> tuple[dict, tuple, dict]:
    """Two operands of one index list joined by an operator their fills both absorb,
    with fills that disagree on its value (the module's docstring): the tensors, the
    term and each operand's fill."""
    idx = permutation(d, vars_)[: d.integer(1, min(2, len(vars_)))]
    op = d.choice(["+", "-", "*", "max", "min"])
    inf = d.choice([-1.0, 1.0]) * np.inf
    if op == "*":
        fills = d.choice([(0.0, inf), (inf, 0.0)])
    elif op in BINARY:
        fills = (inf, d.choice([-1.0, 1.0]) * np.inf)
    else:
        fills = (inf, -inf if op == "+" else inf)
    left, right = (("acc", n, tuple(idx)) for n in "AB")
    if d.boolean(0.3):
        left = ("*", ("lit", d.choice([2, -1, 0.5])), left)
    term = ("fn", op, (left, right)) if op in BINARY else (op, left, right)
    return {"A": list(idx), "B": list(idx)}, term, dict(zip("AB", fills, strict=True))


def draw_operand_format(d: Draw, order: int, blocks: tuple[int, ...]) -> str:
    """A random format (``random_format``), now and then ``nm(n,m)`` or a named blocked
    format whose two block sizes differ."""
    pick = d.integer(0, 11)
    if pick == 0 and order in (2, 3):
        m = d.choice((2, 4, 3))
        return f"nm({d.integer(1, m)},{m})"
    if pick == 1 and order == 2:
        return f"{d.choice(('bcsr', 'bcsc', 'bdcsr'))}({d.integer(1, 3)},{d.integer(1, 3)})"
    return random_format(d, order, blocks, fixed=True, singleton=True)


def fill_of(fmt: str) -> float:
    """The fill a format's text ends with (`` fill=-inf``), 0 without one."""
    _, _, fill = fmt.partition(" fill=")
    return float(fill) if fill else 0.0


def fillable(fmt: str) -> bool:
    """Whether a format may read absent entries as a fill other than 0: it has a
    sparse level and no blocks or fixed-width slots (which are padded with zeros)."""
    letters, _, maps = fmt.partition(":")
    return bool(letters.strip("U")) and "F" not in letters and "/" not in maps and "(" not in fmt


def draw_fill(d: Draw, fmt: str, always: bool = False) -> str:
    """``fmt``, now and then (``always``: always) with a fill; on a format that cannot
    carry one (blocked, fixed-width, ``nm``) only rarely, to see it refused by name."""
    fill = d.choice([f for f in FILLS if f] if always else FILLS)
    if not fill or not fmt or not (fillable(fmt) or d.integer(0, 9) == 0):
        return fmt
    return f"{fmt} fill={fill:g}"


def fixed_width(fmt: str, array: np.ndarray) -> str:
    """``fmt`` with the width of its last, fixed-width level (``F``) set to the most
    entries any of its segments holds in ``array`` (so the others are padded); an empty
    ``array`` (an extent of 0, which no width fits) compressed instead."""
    import ucf

    letters, _, maps = fmt.partition(":")
    if not letters.endswith("F"):
        return fmt
    if not array.size:
        return f"{letters[:-1]}C:{maps}"
    counted = ucf.from_numpy(array, format=f"{letters[:-1]}C:{maps}").levels[-1]["pos"]
    width = max(1, int(np.diff(counted).max(initial=0)))
    return f"{letters[:-1]}F{width}:{maps}"


def draw_case(
    d: Draw,
    targets=("llvm",),
    sparse_output: bool = True,
    functions: bool = True,
    plans: bool = True,
    lang: bool = False,
) -> Case:
    """A random case. ``plans``: some cases dynamic or TeSA plans. ``lang``: the
    language's reductions and fills in every case (tests/lang/test_fuzz_fills.py):
    an explicit reduction wherever a variable can take one, a fill other than 0
    wherever an operand's format can carry one, no plans."""
    nvars = d.integer(1, 4)
    vars_ = VARS[:nvars]
    side = d.integer(1, 4)
    square = d.boolean(0.3)  # equal extents: more ways to read a tensor again
    extents = {v: side if square else d.integer(1, 4) for v in vars_}
    again = d.integer(1, 2) if d.boolean(0.35) else 0  # reads of a tensor read already
    names = NAMES[: d.integer(1, max(1, 4 - again))]  # at most 4 reads: kernels stay small
    tensors: dict[str, list[str]] = {}
    for n in names:
        order = d.integer(1, min(3, nvars))
        if d.boolean(0.15):  # a repeated variable (A(i,i)) is allowed
            tensors[n] = [d.choice(vars_) for _ in range(order)]
        else:
            tensors[n] = permutation(d, list(vars_))[:order]
    reads = [(n, tuple(idx)) for n, idx in tensors.items()]
    for _ in range(again):  # read again, with other indices or the same ones
        n = d.choice(names)
        idx = tuple(d.choice([v for v in vars_ if extents[v] == extents[u]]) for u in tensors[n])
        if d.boolean(0.25):  # A(i,j)*A(i,j): one walk serves both reads
            idx = tuple(tensors[n])
        reads.insert(d.integer(0, len(reads)), (n, idx))
    flipped = nvars >= 2 and d.boolean(0.06)
    if flipped:
        # a sum of terms reading one matrix in two orders (A@x + A.T@y): the default
        # walks each term's operands as stored in loops of its own, scattering the
        # second into a workspace (ucf.schedule.own_order)
        u, v = vars_[0], vars_[1]
        extents[v] = extents[u]
        tensors = {"A": [u, v], "B": [v], "C": [v]}
        reads = [("A", (u, v)), ("B", (v,)), ("A", (v, u)), ("C", (v,))]
    merged = nvars >= 2 and not flipped and d.boolean(0.05)
    clash = not (flipped or merged) and d.boolean(0.25 if lang else 0.05)
    if clash:
        tensors, clashing, clash_fills = draw_clash(d, vars_)
        reads = [("A", tuple(tensors["A"])), ("B", tuple(tensors["B"]))]
        third = d.boolean(0.5)
        if third:  # a third operand joined to the clash (module docstring)
            tensors["C"] = list(tensors["A"])
            c = ("acc", "C", tuple(tensors["C"]))
            # not "*": C's absent 0 times a clashing infinity is NaN in the reference,
            # which leaves the whole reduced range uncompared
            op = d.choice(["+", "-"])
            clashing = (op, c, clashing) if d.boolean(0.5) else (op, clashing, c)
            reads.append(("C", tuple(tensors["C"])))
    if merged:
        # a product of two matrices beside two more (A.*B + C + D): the default
        # intersects the product into a workspace (ucf.schedule.intersections) that
        # a flat loop merges with the other three, where an unmatched workspace must
        # read 0, not an earlier row's value
        u, v = vars_[0], vars_[1]
        tensors = {n: [u, v] for n in "ABCD"}
        reads = [(n, (u, v)) for n in "ABCD"]
    used = sorted({v for _, idx in reads for v in idx}, key=VARS.index)
    extents = {v: max(extents[v], 2) if clash else extents[v] for v in used}
    out_vars = permutation(d, used)[: d.integer(0, len(used))]
    tree = draw_tree(d, reads, functions)
    if flipped:
        out_vars = [u] if d.boolean(0.8) else []
        left, right = (("*", ("acc", *reads[k]), ("acc", *reads[k + 1])) for k in (0, 2))
        tree = (d.choice("+-"), left, right)
    if merged:
        out_vars = [u, v]
        terms = [("*", ("acc", *reads[0]), ("acc", *reads[1])), ("acc", *reads[2])]
        terms.insert(d.integer(0, 2), ("acc", *reads[3]))
        tree = (d.choice("+-"), (d.choice("+-"), terms[0], terms[1]), terms[2])
    if clash:  # reduced by max or min over at least one of its variables
        out_vars = out_vars[: len(used) - 1]
        own = [v for v in used if v not in out_vars]
        reduced = tuple(permutation(d, own)[: d.integer(1, len(own))])
        tree = (d.choice(["max", "min"]), reduced, clashing)
    elif lang or d.integer(0, 3) == 0:
        tree = add_reduction(d, tree, out_vars)
    mode = d.integer(0, 19) if plans and not (lang or clash) else 99
    once = [n for n in tensors if sum(1 for r, _ in reads if r == n) == 1]
    mode = "dynamic" if mode < 2 and once else "tesa" if mode < 4 else "kernel"
    if mode == "kernel" and d.integer(0, 19) == 0:
        # an empty range, where a reduction is its identity; variables a tensor read
        # again pairs with this one have its extent, so they empty with it
        emptied = extents[d.choice(used)]
        extents = {v: 0 if e == emptied else e for v, e in extents.items()}
    block = {v: d.choice([0, 0, 1, 2, 3]) for v in used}
    apart = d.boolean(0.2)  # block sizes per tensor: they may disagree on a variable
    formats = {}
    for n, idx in tensors.items():
        sizes = tuple(d.choice([0, 1, 2, 3]) if apart else block[v] for v in idx)
        formats[n] = draw_operand_format(d, len(idx), sizes)
    if flipped and d.boolean(0.5):  # the scatter's own shape: A compressed, x and y dense
        formats = {"A": d.choice(["UC:0,1", "UC:1,0", "CC:0,1"]), "B": "U:0", "C": "U:0"}
    if merged and d.boolean(0.5):  # the review's shape: every matrix in rows, compressed
        formats = {n: d.choice(["UC:0,1", "CC:0,1"]) for n in "ABCD"}
    if clash:  # formats that carry a fill: the last level compressed, no blocks
        for n in "AB":
            letters, maps = random_format(d, len(tensors[n])).split(":")
            formats[n] = f"{letters[:-1]}C:{maps}"
        if third:  # mostly in blocks: the loop over them visits every block
            sizes = tuple(d.choice([1, 2, 3]) for _ in tensors["C"])
            formats["C"] = "" if d.boolean(0.2) else random_format(d, len(sizes), sizes)
    seed = d.integer(0, 2**32 - 1)
    # a clash is about the coordinates where one operand alone is stored
    density = d.choice([0.3, 0.5, 0.7] if clash else [0.0, 0.3, 0.7, 1.0])
    lhs = f"X({','.join(out_vars)})" if out_vars else "X"
    case = Case(
        f"{lhs} = {render(tree)}", tree, tensors, out_vars, extents, formats, None, seed, density
    )
    # one of the two stored wherever the other is not, or (the result then finite
    # where that one's fill would decide the reduction) stored everywhere
    case.cover = (["A", "B"] if d.boolean(0.5) else [d.choice("AB")]) if clash else None
    arrays = case_arrays(case)
    case.formats = {n: fixed_width(f, arrays[n]) for n, f in formats.items()}
    case.target = d.choice(targets)
    if mode == "dynamic":
        name = d.choice(once)
        case.formats[name] = ""
        tile = draw_tile(d, len(tensors[name]))
        case.dynamic = {"name": name, "tile": tile, "mask": seed + 1, "density": 0.6}
    elif mode == "tesa":
        case.formats = {n: "" for n in tensors}
        case.tesa = draw_tesa(d, {n: arrays[n].shape for n in tensors})
    else:
        if clash:
            case.formats = {  # the third operand and a fill of 0 carry none
                n: f"{f} fill={clash_fills[n]:g}" if clash_fills.get(n) else f
                for n, f in case.formats.items()
            }
        else:
            case.formats = {n: draw_fill(d, f, lang) for n, f in case.formats.items()}
        if sparse_output and out_vars and d.boolean(0.5):
            blocks = tuple(block[v] for v in out_vars)
            out_format = random_format(d, len(out_vars), blocks, unordered=True)
            case.out_format = draw_fill(d, out_format)  # a filled one refuses top sums
    return case


def case_arrays(case: Case) -> dict[str, np.ndarray]:
    """The operands, small integers (every sum exact), ``nm`` ones pruned to fit; where
    an operand's format has a fill, its zeros are that fill."""
    from tests.helpers import rand_sparse

    rng = np.random.default_rng(case.seed)
    arrays = {}
    for n, idx in case.tensors.items():
        shape = tuple(case.extents[v] for v in idx)
        a = rand_sparse(rng, shape, case.density, empty_rows=0, high=4)
        arrays[n] = fit_nm(case.formats.get(n, "").partition(" fill=")[0], a)
    if case.cover:  # the last stored wherever none of the others is
        hole = np.logical_and.reduce([arrays[n] == 0 for n in case.cover])
        arrays[case.cover[-1]][hole] = 1 + rng.integers(0, 3)
    for n, a in arrays.items():
        fill = fill_of(case.formats.get(n, ""))
        arrays[n] = np.where(a == 0, fill, a) if fill else a
    return arrays


# --------------------------------------------------------------------------- reference

_NUMPY = {
    "relu": lambda x: np.maximum(x, 0),
    "abs": np.abs,
    "sign": np.sign,
    "tanh": np.tanh,
    "sin": np.sin,
    "exp": np.exp,
    "cos": np.cos,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "max": np.maximum,
    "min": np.minimum,
}


def read(arrays: dict, leaf: tuple, used: list[str], extents: dict) -> np.ndarray:
    """One access as an array with an axis per variable of ``used`` (1 where it does
    not vary): a repeated index takes the diagonal, as np.einsum does."""
    name, idx = leaf[1], leaf[2]
    own = [v for v in used if v in idx]
    spec = "".join(LETTERS[used.index(v)] for v in idx) + "->"
    spec += "".join(LETTERS[used.index(v)] for v in own)
    a = np.einsum(spec, arrays[name]) if idx else np.asarray(arrays[name])
    return a.reshape([extents[v] if v in idx else 1 for v in used])


def reference(case: Case, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """Dense evaluation with one axis per variable; a variable is summed where the rule
    says, found by where it occurs."""
    used = list(case.extents)
    occurrences: dict[str, list[tuple[int, ...]]] = {}

    def find(t, path):
        if t[0] == "acc":
            for v in t[2]:
                occurrences.setdefault(v, []).append(path)
        for k, c in enumerate(subtrees(t)):
            find(c, (*path, k))

    find(case.tree, ())
    explicit = set()

    def explicit_vars(t):
        if t[0] in REDUCTIONS:
            explicit.update(t[1])
        for c in subtrees(t):
            explicit_vars(c)

    explicit_vars(case.tree)

    def owner(v) -> tuple[int, ...]:
        """The smallest additive term holding every occurrence of v."""
        paths = occurrences[v]
        prefix = paths[0]
        for p in paths[1:]:
            n = 0
            while n < min(len(p), len(prefix)) and p[n] == prefix[n]:
                n += 1
            prefix = prefix[:n]
        while prefix and not additive(prefix):
            prefix = prefix[:-1]
        return prefix

    def additive(path) -> bool:
        parent = case.tree
        for k in path[:-1]:
            parent = subtrees(parent)[k]
        return parent[0] in ("+", "-")

    owners = {v: owner(v) for v in occurrences if v not in case.out_vars and v not in explicit}

    def axes(vs):
        return tuple(used.index(v) for v in vs)

    def box(vs):
        return [case.extents[v] if v in vs else 1 for v in used]

    def ev(t, path):
        kind = t[0]
        if kind == "acc":
            val = read(arrays, t, used, case.extents)
        elif kind == "lit":
            val = np.full([1] * len(used), float(t[1]))
        elif kind == "neg":
            val = -ev(t[1], (*path, 0))
        elif kind == "fn":
            val = _NUMPY[t[1]](*(ev(a, (*path, k)) for k, a in enumerate(t[2])))
        elif kind in REDUCTIONS:
            val = ev(t[2], (*path, 0))
            val = np.broadcast_to(val, np.broadcast_shapes(val.shape, box(t[1])))
            reduce = {"sum": np.sum, "max": np.max, "min": np.min}[kind]
            val = reduce(val, axis=axes(t[1]), keepdims=True, initial=IDENTITY[kind])
        else:
            left, right = ev(t[1], (*path, 0)), ev(t[2], (*path, 1))
            val = {"+": np.add, "-": np.subtract, "*": np.multiply}[kind](left, right)
        mine = [v for v, p in owners.items() if p == path]
        if mine:
            val = np.broadcast_to(val, np.broadcast_shapes(val.shape, box(mine)))
            val = val.sum(axis=axes(mine), keepdims=True)
        return val

    with np.errstate(invalid="ignore", over="ignore"):  # IEEE's NaN: not compared
        val = np.broadcast_to(ev(case.tree, ()), box(case.out_vars))
    val = val.reshape([case.extents[v] for v in used if v in case.out_vars])
    kept = [v for v in used if v in case.out_vars]
    return np.transpose(val, [kept.index(v) for v in case.out_vars])


def einsum_reference(case: Case, arrays: dict[str, np.ndarray]) -> np.ndarray | None:
    """For a sum of products of accesses whose summed variables each occur in one term:
    one np.einsum per term, added with its sign."""

    def terms(t, sign):
        if t[0] in ("+", "-"):
            right = terms(t[2], sign if t[0] == "+" else -sign)
            left = terms(t[1], sign)
            return None if left is None or right is None else left + right
        found = factors(t)
        return None if found is None else [(sign, found)]

    def factors(t):
        if t[0] == "acc":
            return [t]
        if t[0] != "*":
            return None
        left, right = factors(t[1]), factors(t[2])
        return None if left is None or right is None else left + right

    found = terms(case.tree, 1)
    if found is None:
        return None
    for v in case.extents:
        holders = [fs for _, fs in found if any(v in f[2] for f in fs)]
        if v not in case.out_vars and len(holders) > 1:
            return None
    used = list(case.extents)
    total = np.zeros([case.extents[v] for v in case.out_vars])
    for sign, fs in found:
        present = [v for v in case.out_vars if any(v in f[2] for f in fs)]
        spec = ",".join("".join(LETTERS[used.index(v)] for v in f[2]) for f in fs)
        spec += "->" + "".join(LETTERS[used.index(v)] for v in present)
        with np.errstate(invalid="ignore"):
            term = np.einsum(spec, *[arrays[f[1]] for f in fs])
        term = term.reshape([case.extents[v] if v in present else 1 for v in case.out_vars])
        with np.errstate(invalid="ignore"):
            total = total + sign * term
    return total


def uses_transcendental(t) -> bool:
    if t[0] == "fn" and t[1] in TRANSCENDENTAL:
        return True
    return any(uses_transcendental(c) for c in subtrees(t))


# --------------------------------------------------------------------------- running


def results(case: Case) -> tuple[list[np.ndarray], np.ndarray, str]:
    """What ucf computes for the case (and, for a dense output, into out= full of NaN),
    the reference, and a description of what ran, for a failure's message."""
    import warnings

    import ucf

    arrays = case_arrays(case)
    formats = {n: f for n, f in case.formats.items() if f}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)
        if case.tesa:
            got, stored, plan = run_tesa(case.expr, arrays, case.tesa, case.seed, case.target)
            return [got], reference(case, stored), plan
        if case.dynamic:
            got, masked = run_dynamic(case.expr, case.formats, arrays, case.dynamic, case.target)
            return [got], reference(case, masked), f"dynamic {case.dynamic}"
        if case.out_format:
            formats["X"] = case.out_format
        k = ucf.compile(case.expr, formats=formats, target=case.target)
        ops = {n: ucf.from_numpy(a, format=case.formats[n] or None) for n, a in arrays.items()}
        got = [k(shapes=dict(case.extents), **ops).to_numpy()]
        want = reference(case, arrays)
        if not case.out_format and want.ndim:
            # into a given output full of NaN: the kernel, or the call, must clear every
            # element it does not compute (ucf.lower.zeroing decides which of the two)
            out = np.full(want.shape, np.nan)
            k(shapes=dict(case.extents), out=out, **ops)
            got.append(out)
    by_terms = einsum_reference(case, arrays)
    # np.einsum may factor a product of sums (sum(A) * sum(B) for "k,j->"), which IEEE
    # arithmetic only agrees with on finite values (0 * -inf; seed 45 case 253)
    if by_terms is not None and all(np.isfinite(a).all() for a in arrays.values()):
        np.testing.assert_array_equal(want, by_terms)
    return got, want, f"formats={formats}"


def compare(case: Case, got: np.ndarray, want: np.ndarray, message: str) -> None:
    """Every element the reference defines (not IEEE's NaN, where ucf's structural
    rule for fills decides instead) equal, or close where rounding differs."""
    assert got.shape == want.shape, f"{case.expr}: shape {got.shape}, want {want.shape}"
    defined = ~np.isnan(want)
    got, want = got[defined], want[defined]
    if case.tesa:  # the reference reads the plan's stored values, in float64 too
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9, err_msg=message)
    elif uses_transcendental(case.tree):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=message)
    else:
        np.testing.assert_array_equal(got, want, err_msg=message)


def refused(case: Case, error: Exception) -> bool:
    """Whether ``error`` is a refusal the docs promise for what the case drew: a dynamic
    operand the statement cannot serve, a fill on a blocked or fixed-width format or on
    a tensor read with a repeated variable (``A(i,i)``, read through an affine index), a
    fill beside a fixed-width level split into blocks, a filled sparse output
    under a sum at the top (docs/language.md)."""
    import ucf

    if case.dynamic:
        return isinstance(error, refusals())
    text = str(error)
    drawn = [*case.formats.values(), case.out_format or ""]
    if isinstance(error, ucf.UnsupportedError) and "with a repeated index variable" in text:
        diagonal = [r[1] for r in leaves(case.tree) if len(set(r[2])) < len(r[2])]
        return any(fill_of(case.formats[n]) for n in diagonal)
    if isinstance(error, ucf.FormatError) and "blocked or fixed-width" in text:
        return any(fill_of(f) and not fillable(f) for f in drawn)
    if isinstance(error, ucf.UnsupportedError) and "its padding entries" in text:
        # a fixed-width level split into blocks (its own, or another operand's on a
        # variable it shares)
        formats = case.formats.values()
        fixed = any(f.startswith("nm(") or "F" in f.partition(":")[0] for f in formats)
        blocked = any(f.startswith(("nm(", "b")) or "/" in f for f in drawn)  # output too
        return any(fill_of(f) for f in drawn) and fixed and blocked
    if isinstance(error, ucf.UnsupportedError) and "a sum that meets no entry is 0" in text:
        return bool(case.out_format and fill_of(case.out_format))
    return False


def check(case: Case) -> None:
    """Raise unless ucf computes the reference or refuses the case as the docs say."""
    import ucf

    try:
        got, want, what = results(case)
    except ucf.UcfError as e:
        if refused(case, e):
            return
        raise
    for g in got:
        compare(case, g, want, f"{case.expr} {what}")


def run_case(case: Case) -> Outcome:
    """Compile and run one case in this process, and judge the result (a worker's)."""
    import ucf

    try:
        got, want, what = results(case)
    except ucf.CompileError as e:
        return Outcome("error", f"CompileError: {e}")
    except ucf.UcfError as e:
        if refused(case, e):
            return Outcome("refused", f"{type(e).__name__}: {e}")
        return Outcome("error", f"{type(e).__name__}: {e}")
    except Exception:
        return Outcome("error", traceback.format_exc())
    try:
        for g in got:
            compare(case, g, want, what)
    except AssertionError as e:
        return Outcome("wrong", str(e)[-2000:])
    return Outcome("ok")


def repro(case: Case, outcome: Outcome | None = None) -> str:
    """A standalone script that reruns the case (the generator rebuilds its data)."""
    from dataclasses import asdict

    lines = [f"# statement fuzz, {case.mode} case on target {case.target}"]
    if outcome is not None:
        lines += [f"# outcome: {outcome.status}"]
        lines += [f"#   {line}" for line in outcome.detail.strip().splitlines()[-12:]]
    fields = asdict(case)
    lines += [
        "import sys",
        f"sys.path[:0] = [{str(_TESTS.parent)!r}]",
        "from tests.statement_fuzz import Case, check",
        "",
        f"check(Case(**{fields!r}))",
        "",
    ]
    return "\n".join(lines)


def simpler(case: Case):
    """Cases one step simpler than ``case``, for the long run's minimizer."""
    from dataclasses import replace

    if case.target != "llvm":
        yield replace(case, target="llvm")
    if case.out_format:
        yield replace(case, out_format=None)
    for n, f in case.formats.items():
        if fill_of(f):
            yield replace(case, formats={**case.formats, n: f.partition(" fill=")[0]})
    for n, f in case.formats.items():
        if f and not (case.dynamic or case.tesa):
            yield replace(case, formats={**case.formats, n: ""})
    if case.density not in (0.3, 0.0):
        yield replace(case, density=0.3)
    if case.seed:
        yield replace(case, seed=0)


_TESTS = __import__("pathlib").Path(__file__).resolve().parent
