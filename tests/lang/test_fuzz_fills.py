"""Differential fuzzing: random statements with fills and max/min reductions against numpy.

(Main's statement fuzzer, kept beside ``tests/test_fuzz.py`` when issue 32 moved that
one's generator to ``tests/statement_fuzz.py``; to be folded into it, so the long run
draws fills and max/min reductions too.)

Statements mix products, sums and differences of accesses with different
index variables, unary minus, literals, element-wise functions and explicit
``sum``, ``max`` and ``min`` reductions; sparse operands and outputs may read
absent entries as a fill value (``fill=-inf``, ``fill=inf``, ``fill=1``).  The
reference reads the reduction rule straight from its definition, on dense
arrays with numpy broadcasting: a variable missing from the output is summed
over the smallest additive term (the whole right-hand side, or an operand of
``+``/``-``) that holds all of its occurrences.  For statements that are sums
of products of accesses a second reference, one ``np.einsum`` per term, checks
the first.

Where a fill meets what IEEE arithmetic makes NaN of (``-inf * 0``, ``inf -
inf``), ucf's structural rule decides instead (``ucf.lang.algebra``: an absent
0 absorbs a product, an infinity a sum); everywhere else the two agree, so
elements the IEEE reference holds NaN at are not compared.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import ucf
from tests.helpers import needs_cc, rand_sparse
from ucf.schedule import cpu_model

VARS = ["i", "j", "k", "l"]
NAMES = ["A", "B", "C", "D"]
UNARY = ["relu", "abs", "sign", "tanh", "sin", "exp", "cos", "sigmoid"]
BINARY = ["max", "min"]
TRANSCENDENTAL = {"tanh", "sin", "exp", "cos", "sigmoid"}

# A tree is ("acc", name) | ("lit", value) | ("neg", t) | (op, left, right) for op in + - *
# | ("fn", name, (args...)) | ("red", op, (vars...), body) for op in sum max min.
REDUCTIONS = ["sum", "max", "min"]
#: Fill values a sparse operand or output may read its absent entries as.
FILLS = [0.0, 0.0, 0.0, -np.inf, np.inf, 1.0]


@dataclass
class Case:
    expr: str
    tree: tuple
    accesses: dict[str, tuple[str, ...]]
    out_vars: tuple[str, ...]
    extents: dict[str, int]
    formats: dict[str, str]
    arrays: dict[str, np.ndarray]
    out_format: str | None


def render(t, accesses) -> str:
    kind = t[0]
    if kind == "acc":
        return f"{t[1]}({','.join(accesses[t[1]])})" if accesses[t[1]] else t[1]
    if kind == "lit":
        return repr(t[1])
    if kind == "neg":
        return f"-({render(t[1], accesses)})"
    if kind == "fn":
        return f"{t[1]}({', '.join(render(a, accesses) for a in t[2])})"
    if kind == "red":
        return f"{t[1]}({', '.join(t[2])}, {render(t[3], accesses)})"
    op, left, right = t
    return f"({render(left, accesses)}) {op} ({render(right, accesses)})"


def subtrees(t):
    kind = t[0]
    if kind in ("acc", "lit"):
        return ()
    if kind == "neg":
        return (t[1],)
    if kind == "fn":
        return t[2]
    if kind == "red":
        return (t[3],)
    return (t[1], t[2])


def variables(t, accesses) -> set[str]:
    if t[0] == "acc":
        return set(accesses[t[1]])
    return set().union(*(variables(c, accesses) for c in subtrees(t)))


@st.composite
def trees(draw, names):
    if len(names) == 1:
        leaf = ("acc", names[0])
        if draw(st.integers(0, 5)) == 0:
            leaf = ("*", ("lit", draw(st.sampled_from([2, -1, 0.5]))), leaf)
        return leaf
    split = draw(st.integers(1, len(names) - 1))
    left, right = draw(trees(names[:split])), draw(trees(names[split:]))
    shape = draw(st.integers(0, 9))
    if shape == 0:
        return ("fn", draw(st.sampled_from(BINARY)), (left, right))
    t = (draw(st.sampled_from("+-*")), left, right)
    if shape == 1:
        t = ("neg", t)
    elif shape == 2:
        t = ("fn", draw(st.sampled_from(UNARY)), (t,))
    return t


def add_sum(draw, tree, accesses, out_vars):
    """Wrap one subtree in an explicit reduction over a variable used only inside it."""
    nodes = []

    def collect(t):
        nodes.append(t)
        for c in subtrees(t):
            collect(c)

    collect(tree)
    target = draw(st.sampled_from(nodes))
    rest_vars: dict[str, int] = {}

    def count(t):
        if t[0] == "acc":
            for v in accesses[t[1]]:
                rest_vars[v] = rest_vars.get(v, 0) + 1
        for c in subtrees(t):
            count(c)

    count(tree)
    inside: dict[str, int] = {}
    for v in variables(target, accesses):
        inside[v] = 0

    def count_in(t):
        if t[0] == "acc":
            for v in accesses[t[1]]:
                inside[v] += 1
        for c in subtrees(t):
            count_in(c)

    count_in(target)
    own = sorted(v for v in inside if v not in out_vars and inside[v] == rest_vars[v])
    if not own:
        return tree
    picked = tuple(draw(st.lists(st.sampled_from(own), min_size=1, unique=True)))
    op = draw(st.sampled_from(REDUCTIONS))

    def rebuild(t):
        if t is target:
            return ("red", op, picked, t)
        kind = t[0]
        if kind in ("acc", "lit"):
            return t
        if kind == "neg":
            return ("neg", rebuild(t[1]))
        if kind == "fn":
            return ("fn", t[1], tuple(rebuild(a) for a in t[2]))
        if kind == "red":
            return ("red", t[1], t[2], rebuild(t[3]))
        return (t[0], rebuild(t[1]), rebuild(t[2]))

    return rebuild(tree)


def random_format(
    draw, order: int, blocks: tuple[int, ...] = (), fixed: bool = False, unordered: bool = False
) -> str:
    """U/C levels in a random mode order; a mode with a block size in ``blocks`` may be
    stored in blocks (its block among the outer levels, its place among the inner).
    ``fixed``: the last level may be fixed-width, written ``F`` until the data gives
    its width (:func:`fixed_width`). ``unordered``: it may be unordered (``Q``, an
    output's: appended in whatever order the kernel produces)."""
    if order == 0:
        return ""
    perm = draw(st.permutations(range(order)))
    blocked = [m for m in perm if blocks and blocks[m] and draw(st.booleans())]
    maps = [f"{m}/{blocks[m]}" if m in blocked else str(m) for m in perm]
    maps += [f"{m}%{blocks[m]}" for m in blocked]
    letters = "".join(draw(st.sampled_from("UC")) for _ in maps)
    if fixed and draw(st.integers(0, 4)) == 0:
        letters = letters[:-1] + "F"
    elif unordered and draw(st.integers(0, 4)) == 0:
        letters = letters[:-1] + "Q"
    return f"{letters}:{','.join(maps)}"


def fixed_width(fmt: str, array: np.ndarray) -> str:
    """``fmt`` with the width of its last, fixed-width level (``F``) set to the most
    entries any of its segments holds in ``array`` (so the others are padded)."""
    letters, _, maps = fmt.partition(":")
    if not letters.endswith("F"):
        return fmt
    counted = ucf.from_numpy(array, format=f"{letters[:-1]}C:{maps}").levels[-1]["pos"]
    width = max(1, int(np.diff(counted).max(initial=0)))
    return f"{letters[:-1]}F{width}:{maps}"


def fillable(fmt: str) -> bool:
    """Whether a format may read absent entries as a fill other than 0: it has a
    sparse level and no blocks or fixed-width slots (which are padded with zeros)."""
    letters, _, maps = fmt.partition(":")
    return bool(letters.strip("U")) and "F" not in letters and "/" not in maps


@st.composite
def cases(draw, sparse_output=True, functions=True, fills=True):
    nvars = draw(st.integers(1, 4))
    vars_ = VARS[:nvars]
    nops = draw(st.integers(1, 4))
    names = NAMES[:nops]
    accesses = {}
    for n in names:
        size = draw(st.integers(1, min(3, nvars)))
        accesses[n] = tuple(
            draw(st.lists(st.sampled_from(vars_), min_size=size, max_size=size, unique=True))
        )
    used = sorted({v for a in accesses.values() for v in a}, key=VARS.index)
    out_vars = tuple(draw(st.lists(st.sampled_from(used), max_size=len(used), unique=True)))
    extents = {v: draw(st.integers(1, 4)) for v in used}
    tree = draw(trees(names))
    if not functions:
        tree = strip_functions(tree)
    if draw(st.integers(0, 3)) == 0:
        tree = add_sum(draw, tree, accesses, out_vars)
    # Block sizes per variable (tensors that store a variable in blocks agree on it).
    block = {v: draw(st.sampled_from([0, 0, 1, 2, 3])) for v in used}
    formats = {
        n: random_format(draw, len(accesses[n]), tuple(block[v] for v in accesses[n]), True)
        for n in names
    }
    seed = draw(st.integers(0, 2**32 - 1))
    density = draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
    rng = np.random.default_rng(seed)
    arrays = {
        n: rand_sparse(rng, tuple(extents[v] for v in accesses[n]), density, empty_rows=0, high=4)
        for n in names
    }
    formats = {n: fixed_width(f, arrays[n]) for n, f in formats.items()}
    for n in names:
        fill = draw(st.sampled_from(FILLS)) if fills else 0.0
        if fill and fillable(formats[n]):
            formats[n] += f" fill={fill}"
            arrays[n] = np.where(arrays[n] == 0, fill, arrays[n])
    out_format = None
    if sparse_output and out_vars and draw(st.booleans()):
        blocks = tuple(block[v] for v in out_vars)
        out_format = random_format(draw, len(out_vars), blocks, unordered=True)
        fill = draw(st.sampled_from(FILLS)) if fills else 0.0
        if fill and fillable(out_format):
            out_format += f" fill={fill}"
    lhs = f"X({','.join(out_vars)})" if out_vars else "X"
    expr = f"{lhs} = {render(tree, accesses)}"
    return Case(expr, tree, accesses, out_vars, extents, formats, arrays, out_format)


def strip_functions(t):
    kind = t[0]
    if kind in ("acc", "lit"):
        return t
    if kind == "neg":
        return ("neg", strip_functions(t[1]))
    if kind == "fn":
        args = [strip_functions(a) for a in t[2]]
        return args[0] if len(args) == 1 else ("+", args[0], args[1])
    if kind == "red":
        return ("red", t[1], t[2], strip_functions(t[3]))
    return (t[0], strip_functions(t[1]), strip_functions(t[2]))


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


def reference(case: Case) -> np.ndarray:
    """Dense evaluation with one axis per variable; a variable is summed where the rule
    says, found by where it occurs."""
    used = list(case.extents)
    occurrences: dict[str, list[tuple[int, ...]]] = {}

    def find(t, path):
        if t[0] == "acc":
            for v in case.accesses[t[1]]:
                occurrences.setdefault(v, []).append(path)
        for k, c in enumerate(subtrees(t)):
            find(c, (*path, k))

    find(case.tree, ())
    explicit = set()

    def explicit_vars(t):
        if t[0] == "red":
            explicit.update(t[2])
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

    def full(name):
        a = case.arrays[name]
        acc = case.accesses[name]
        order = sorted(range(len(acc)), key=lambda m: used.index(acc[m]))
        a = np.transpose(a, order)
        return a.reshape([case.extents[v] if v in acc else 1 for v in used])

    def axes(vs):
        return tuple(used.index(v) for v in vs)

    def ev(t, path):
        kind = t[0]
        if kind == "acc":
            val = full(t[1])
        elif kind == "lit":
            val = np.full([1] * len(used), float(t[1]))
        elif kind == "neg":
            val = -ev(t[1], (*path, 0))
        elif kind == "fn":
            val = _NUMPY[t[1]](*(ev(a, (*path, k)) for k, a in enumerate(t[2])))
        elif kind == "red":
            val = ev(t[3], (*path, 0))
            val = np.broadcast_to(val, np.broadcast_shapes(val.shape, _box(t[2])))
            reduce = {"sum": np.sum, "max": np.max, "min": np.min}[t[1]]
            val = reduce(val, axis=axes(t[2]), keepdims=True)
        else:
            left, right = ev(t[1], (*path, 0)), ev(t[2], (*path, 1))
            with np.errstate(invalid="ignore"):
                val = {"+": np.add, "-": np.subtract, "*": np.multiply}[kind](left, right)
        mine = [v for v, p in owners.items() if p == path]
        if mine:
            val = np.broadcast_to(val, np.broadcast_shapes(val.shape, _box(mine)))
            val = val.sum(axis=axes(mine), keepdims=True)
        return val

    def _box(vs):
        return [case.extents[v] if v in vs else 1 for v in used]

    with np.errstate(invalid="ignore", over="ignore"):
        tree = ev(case.tree, ())
    val = np.broadcast_to(tree, [case.extents[v] if v in case.out_vars else 1 for v in used])
    val = val.reshape([case.extents[v] for v in used if v in case.out_vars])
    kept = [v for v in used if v in case.out_vars]
    return np.transpose(val, [kept.index(v) for v in case.out_vars])


def einsum_reference(case: Case) -> np.ndarray | None:
    """For a sum of products of accesses whose summed variables each occur in one term:
    one np.einsum per term, added with its sign."""

    def terms(t, sign):
        if t[0] in ("+", "-"):
            right = terms(t[2], sign if t[0] == "+" else -sign)
            left = terms(t[1], sign)
            return None if left is None or right is None else left + right
        names = factors(t)
        return None if names is None else [(sign, names)]

    def factors(t):
        if t[0] == "acc":
            return [t[1]]
        if t[0] != "*":
            return None
        left, right = factors(t[1]), factors(t[2])
        return None if left is None or right is None else left + right

    found = terms(case.tree, 1)
    if found is None:
        return None
    for v in case.extents:
        holders = [names for _, names in found if any(v in case.accesses[n] for n in names)]
        if v not in case.out_vars and len(holders) > 1:
            return None
    out = "".join(case.out_vars)
    total = np.zeros([case.extents[v] for v in case.out_vars])
    for sign, names in found:
        spec = ",".join("".join(case.accesses[n]) for n in names)
        term = np.einsum(
            f"{spec}->{''.join(v for v in out if any(v in case.accesses[n] for n in names))}",
            *[case.arrays[n] for n in names],
        )
        present = [v for v in case.out_vars if any(v in case.accesses[n] for n in names)]
        term = term.reshape([case.extents[v] if v in present else 1 for v in case.out_vars])
        total = total + sign * term
    return total


def uses_transcendental(t) -> bool:
    if t[0] == "fn" and t[1] in TRANSCENDENTAL:
        return True
    return any(uses_transcendental(c) for c in subtrees(t))


def check(case: Case, target: str) -> None:
    formats = {n: f for n, f in case.formats.items() if f}
    if case.out_format:
        formats["X"] = case.out_format
    try:
        k = ucf.compile(case.expr, formats=formats, target=target)
        ops = {n: ucf.from_numpy(a, format=case.formats[n] or None) for n, a in case.arrays.items()}
        got = k(shapes=dict(case.extents), **ops).to_numpy()
    except ucf.UnsupportedError as e:
        # The fills the rules refuse: a sum that meets no entry is 0, not the fill; a
        # fixed-width level's padding past a partial block would meet an infinite fill.
        refused = ("a sum that meets no entry is 0", "fixed-width padding entries")
        assume(not any(r in str(e) for r in refused))
        raise
    want = reference(case)
    by_terms = einsum_reference(case)
    if by_terms is not None:
        np.testing.assert_array_equal(want, by_terms)
    assert got.shape == want.shape, case.expr
    message = f"{case.expr} formats={formats}"
    results = [got]
    if not case.out_format and want.ndim:
        # into a given output full of NaN: the kernel, or the call, must clear every
        # element it does not compute (ucf.lower.zeroing decides which of the two)
        out = np.full(want.shape, np.nan)
        k(shapes=dict(case.extents), out=out, **ops)
        results.append(out)
    defined = ~np.isnan(want)  # IEEE's NaN where ucf's structural rule decides
    for result in results:
        if uses_transcendental(case.tree):
            np.testing.assert_allclose(
                result[defined], want[defined], rtol=1e-12, atol=1e-12, err_msg=message
            )
        else:
            np.testing.assert_array_equal(result[defined], want[defined], err_msg=message)


def _case(expr, tree, accesses, out_vars, arrays):
    extents = {}
    for name, vs in accesses.items():
        for v, n in zip(vs, arrays[name].shape, strict=True):
            extents[v] = n
    return Case(expr, tree, accesses, out_vars, extents, {}, arrays, None)


def test_reference_sums_each_term_over_its_own_variables():
    rng = np.random.default_rng(0)
    X = rng.integers(1, 5, (2, 3, 4)).astype(float)
    v = rng.integers(1, 5, 4).astype(float)
    W = rng.integers(1, 5, (2, 3)).astype(float)
    case = _case(
        "M(i,j) = X(i,j,k) * v(k) + W(i,j)",
        ("+", ("*", ("acc", "X"), ("acc", "v")), ("acc", "W")),
        {"X": ("i", "j", "k"), "v": ("k",), "W": ("i", "j")},
        ("i", "j"),
        {"X": X, "v": v, "W": W},
    )
    np.testing.assert_array_equal(reference(case), np.einsum("ijk,k->ij", X, v) + W)


def test_reference_sums_a_product_of_a_sum_as_a_whole():
    rng = np.random.default_rng(1)
    B = rng.integers(1, 5, (2, 3)).astype(float)
    c = rng.integers(1, 5, 2).astype(float)
    x = rng.integers(1, 5, 3).astype(float)
    case = _case(
        "y(i) = (B(i,j) + c(i)) * x(j)",
        ("*", ("+", ("acc", "B"), ("acc", "c")), ("acc", "x")),
        {"B": ("i", "j"), "c": ("i",), "x": ("j",)},
        ("i",),
        {"B": B, "c": c, "x": x},
    )
    np.testing.assert_array_equal(reference(case), B @ x + c * x.sum())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_fuzz_llvm(case):
    check(case, "llvm")


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_fuzz_llvm_long(case):
    check(case, "llvm")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_fuzz_default_model_parallel_choices(case):
    """The default model's parallel choices (hoisted loops, chunks, ``bound``) on the
    fuzzer's small inputs: its thresholds are lowered so that every case gets them."""
    ucf.set_num_threads(2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_model, "CHUNK_WORK", 2)
        mp.setattr(cpu_model, "CHUNKS_PER_THREAD", 1)
        mp.setattr(cpu_model, "SKEWED", 0.0)
        mp.setattr(cpu_model, "REPLAN_WORK", 0)
        check(case, "llvm")


@needs_cc
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_fuzz_c(case):
    check(case, "c")
