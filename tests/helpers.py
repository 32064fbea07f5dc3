"""Helpers the tests share: targets, random operands of small integer values, and
stored-coordinate sets. Fixtures live in ``tests/conftest.py``."""

from __future__ import annotations

import contextlib
import itertools
import shutil
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

CC = shutil.which("cc")
HAVE_CC = CC is not None
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="target 'c' needs a C compiler (cc)")


# Hypothesis, one way for the whole suite: tests/conftest.py loads "ci", so the default
# suite draws the same examples every run (derandomized, seeded from each test's own
# source, no database) and a CI run cannot fail on a shape nobody has seen, as the fills
# fuzz once did (the wrong answer fixed in 3e9ff98). Exploring at random belongs to the
# slow tests, which take EXPLORE as their settings' parent, to ``pytest
# --hypothesis-profile=explore`` and to the long runs of bench/fuzz.py. Neither profile
# has a deadline or checks how fast examples are drawn: on a shared machine both only
# measure the load.
_UNTIMED = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", derandomize=True, database=None, **_UNTIMED)
settings.register_profile("explore", derandomize=False, **_UNTIMED)
EXPLORE = settings.get_profile("explore")


#: Both code generators; the C one is skipped without a C compiler.
TARGETS = ["llvm", pytest.param("c", marks=needs_cc)]


def target_param(t: str):
    """A target as a pytest param, with the C-compiler skip mark where needed."""
    return pytest.param(t, marks=needs_cc) if t == "c" else t


def format_targets(formats, on_c) -> list:
    """(format, target) params: every format on llvm, those in ``on_c`` on c too, and
    the others on c in the slow run only (the c target's compiles are what cost)."""
    out = []
    for f in formats:
        out.append(pytest.param(f, "llvm", id=f"{f}-llvm"))
        marks = [needs_cc] if f in on_c else [needs_cc, pytest.mark.slow]
        out.append(pytest.param(f, "c", marks=marks, id=f"{f}-c"))
    return out


def pairwise(rows: list[tuple]) -> list[tuple]:
    """Rows of ``rows`` that together hold every value of each column, and every pair of
    values that two of its columns take together anywhere in ``rows``: a covering array,
    picked greedily (the row covering the most not yet covered, the first of equals), in
    ``rows``' order. A wrong answer that needs two operands' formats to meet shows in one
    of these; rows of one column are all kept."""

    covers = {
        row: {(a, row[a], b, row[b]) for a in range(len(row)) for b in range(a, len(row))}
        for row in rows
    }
    left = set().union(*covers.values())
    kept = set()
    while left:
        best = max(covers, key=lambda r: len(covers[r] & left))
        kept.add(best)
        left -= covers[best]
    return [r for r in rows if r in kept]


def covered(*lists) -> list:
    """Params over the product of ``lists`` for a test whose every row is costly (a build
    under ASan) or whose rows are too many (test_conv's on llvm: ``covered(["llvm"],
    ...)``; formats by targets, the target last as a stacked ``TARGETS`` decorator names
    it: ``covered(uc_combos(3), uc_combos(2), ["llvm", "c"])``): the rows of ``pairwise``
    in the default suite, the others in the slow run only. A row on the c target skips
    without a C compiler."""
    rows = list(itertools.product(*lists))
    kept = set(pairwise(rows))
    params = []
    for r in rows:
        marks = [] if r in kept else [pytest.mark.slow]
        params.append(pytest.param(*r, marks=[*marks, needs_cc] if "c" in r else marks))
    return params


def product_params(*lists, c_subset=None, every_llvm_row=True) -> list:
    """(target, *row) params over the product of ``lists``: every row on llvm; on c the
    rows ``c_subset`` keeps (a predicate on the row; None keeps ``pairwise``'s, which for
    one or two lists is every row), the others on c in the slow run only. The c target's
    compiles (gcc) are what cost; c against llvm on every row is the slow run's, and the
    fuzzers' (bench/fuzz.py). Without ``every_llvm_row`` llvm too runs ``pairwise``'s
    rows by default and the others in the slow run: for a product so large that its llvm
    rows alone cost a minute of the suite."""
    rows = list(itertools.product(*lists))
    kept = set(pairwise(rows))
    on_c = kept if c_subset is None else {r for r in rows if c_subset(r)}
    params = []
    for row in rows:
        marks = [] if every_llvm_row or row in kept else [pytest.mark.slow]
        params.append(pytest.param("llvm", *row, marks=marks))
        marks = [needs_cc] if row in on_c else [needs_cc, pytest.mark.slow]
        params.append(pytest.param("c", *row, marks=marks))
    return params


def rand_values(rng, n, dtype=np.float64, low=1, high=10, signed=True):
    """``n`` small integer-valued entries (exact in every dtype), never zero."""
    v = rng.integers(low, high, size=n)
    if signed:
        v = v * rng.choice([-1, 1], size=n)
    return v.astype(dtype)


def rand_sparse(
    rng, shape, density=0.3, dtype=np.float64, empty_rows=1, low=1, high=10, signed=True
):
    """A dense array with about ``density`` nonzeros and ``empty_rows`` all-zero mode-0 slices.

    Values are small nonzero integers so that results are exact in float32,
    float64 and int64 and never cancel accidentally when ``signed`` is False.
    """
    shape = tuple(shape)
    a = np.zeros(shape, dtype=dtype)
    mask = rng.random(shape) < density
    if shape and shape[0] > 1 and empty_rows:
        rows = rng.choice(shape[0], size=min(empty_rows, shape[0] - 1), replace=False)
        mask[rows] = False
    a[mask] = rand_values(rng, int(mask.sum()), dtype, low, high, signed)
    return a


def rand_dense(rng, shape, dtype=np.float64, low=1, high=10, signed=True):
    """A fully dense array of small nonzero integer values."""
    n = int(np.prod(shape, dtype=np.int64))
    return rand_values(rng, n, dtype, low, high, signed).reshape(shape)


def stored_coords(t) -> set[tuple[int, ...]]:
    """The set of coordinates a ucf.Tensor stores (explicit zeros included)."""
    coords, _ = t.to_coo()
    return {tuple(int(x) for x in row) for row in coords}


def nonzero_coords(a) -> set[tuple[int, ...]]:
    """The coordinates of a dense array's nonzeros."""
    return {tuple(int(x) for x in row) for row in np.argwhere(np.asarray(a) != 0)}


def matrix_formats(kinds=("UU", "UC", "CU", "CC")) -> list[str]:
    """Every level-kind string with both mode orders."""
    return [f"{k}:{o}" for k in kinds for o in ("0,1", "1,0")]


def uc_combos(order: int) -> list[str]:
    """All 2**order U/C level strings of the given order."""
    out = [""]
    for _ in range(order):
        out = [s + c for s in out for c in "UC"]
    return out


def arrival_operands(rng, cols: int) -> tuple:
    """CSR A and B whose product C = A @ B has rows that reach a Gustavson workspace in
    chosen orders, one row per way its sort goes: short lists, sorted and reversed ones,
    ranked, bucketed and radix-sorted ones, keys bunched in a few buckets of a wide
    range (within the bucketed sort's limit, and beyond it), a narrow range, and the
    full row. Row r of A picks, in order, rows of B that
    hold one entry each, at the coordinates of list r."""
    import scipy.sparse as sp

    assert cols >= 5000
    few = rng.choice(np.arange(80, 2000), 20, replace=False)
    bunched = 3000 + np.concatenate([rng.permutation(80), few])
    # 190 consecutive keys in a range of the whole row: too many pairs in their few
    # buckets, so the bucketed sort hands the row to the radix sort
    crowded = np.concatenate([100 + np.arange(190), rng.choice(np.arange(2000, cols), 10, False)])
    lists = [
        rng.permutation(cols)[:2],
        rng.permutation(cols)[:16],
        np.sort(rng.permutation(cols)[:200]),
        np.sort(rng.permutation(cols)[:200])[::-1],
        *(rng.permutation(cols)[:n] for n in (17, 32, 33, 100, 1000)),
        rng.permutation(bunched),
        rng.permutation(crowded),
        1000 + rng.permutation(300),
        rng.permutation(cols),
    ]
    starts = np.concatenate([[0], np.cumsum([len(x) for x in lists])])
    picks = np.arange(starts[-1])
    a = sp.csr_matrix((rng.integers(1, 5, picks.size) * 1.0, picks, starts))
    keys = np.concatenate(lists)
    b = sp.csr_matrix(
        (rng.integers(1, 5, keys.size) * 1.0, keys, np.arange(keys.size + 1)),
        shape=(keys.size, cols),
    )
    return a, b


def tile_mask(rng, shape, tile, sparsity):
    """A mask whose live elements come in whole ``tile``s (cut at the edges), each tile
    dead with probability ``sparsity``, and inside a live tile each element live with
    probability 0.7 (so tiles are not all full)."""
    grid = [-(-n // t) for n, t in zip(shape, tile, strict=True)]
    live = rng.random(grid) >= sparsity
    for axis, t in enumerate(tile):
        live = np.repeat(live, t, axis=axis)
    live = live[tuple(slice(0, n) for n in shape)]
    return live & (rng.random(shape) < 0.7)


@contextlib.contextmanager
def whole_team():
    """Every parallel region on the whole team, the loops' team states left as they are
    (``UCF_ADAPTIVE_TEAM=0``'s flag, ``ucf.codegen.llvm_team.FIXED``): a test that calls
    a default kernel repeatedly then sees the same plan whatever the machine's load (a
    loop whose region lost would otherwise run the plan for one thread for a while)."""
    from ucf.toolchain import jit

    old = jit.set_whole_team(True)
    try:
        yield
    finally:
        jit.set_whole_team(old)


def parsed_formats(statement: str, spelled: dict[str, str]) -> dict:
    """Format text parsed against a statement's tensors, as ``ucf.tune`` parses what it
    is given: the tuner's modules take ``Format`` objects."""
    from ucf.format.format import parse_formats
    from ucf.lang.ast import statement_orders
    from ucf.lang.parser import parse_statement

    return parse_formats(spelled, statement_orders(parse_statement(statement)))


def assert_exact(got, want) -> None:
    """A kernel's result equals scipy's ``want`` (a sparse matrix: compared as CSR) or
    numpy's (a dense array), to rounding: the check the team and race tests make of
    every call, whichever plan ran it."""
    if hasattr(want, "tocsr"):
        assert abs(got.to_scipy().tocsr() - want).max() <= 1e-12
    else:
        np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-12)


def exact_fma(a: float, b: float, c: float) -> float:
    """fl(a * b + c) in float64, from the exact value (Python's int division rounds
    correctly)."""
    return float(Fraction(a) * Fraction(b) + Fraction(c))


def documented_sum(terms: list[tuple[float, float]], parts: int) -> float:
    """The sum of ``a * b`` over ``terms`` in the order docs/design.md gives: fewer than
    4 * parts terms in one chain; else term t of the whole blocks into partial sum
    t % parts, the partial sums folded in halves and added to the sum's start (0), then
    the last terms in order."""
    if len(terms) < 4 * parts:
        total = 0.0
        for a, b in terms:
            total = exact_fma(a, b, total)
        return total
    whole = len(terms) // parts * parts
    s = [0.0] * parts
    for t, (a, b) in enumerate(terms[:whole]):
        s[t % parts] = exact_fma(a, b, s[t % parts])
    while len(s) > 1:
        half = len(s) // 2
        s = [s[q] + s[q + half] for q in range(half)]
    total = 0.0 + s[0]
    for a, b in terms[whole:]:
        total = exact_fma(a, b, total)
    return total
