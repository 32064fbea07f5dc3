"""A max or min walks only the coordinates its body does not fold to one constant, and
folds that constant in once where a coordinate was skipped (issue 34).

Checked against scipy's ``max(axis=...)``/``min(axis=...)`` and numpy on dense copies
(absent entries holding their fills, NaN skipped as the docs promise), on llvm and c,
the CUDA emulator, over csr, csc, dcsr, coo and dense operands with empty, full and
NaN rows, fills other than 0, integer kernels, sparse outputs and nested reductions.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from tests.helpers import TARGETS, needs_cc

IDENTITY = {"max": -np.inf, "min": np.inf}


def extreme(op: str, d: np.ndarray, axis) -> np.ndarray:
    """numpy's max or min over ``axis`` skipping NaN; over no coordinate, the identity."""
    ident = IDENTITY[op]
    fn = np.max if op == "max" else np.min
    return fn(np.where(np.isnan(d), ident, d), axis=axis, initial=ident)


def scipy_matrix(rng, n: int, m: int) -> sp.csr_matrix:
    """Values in [-1, 1), an empty row, a full row, the rest 30 % dense."""
    a = (rng.random((n, m)) < 0.3) * (rng.random((n, m)) * 2 - 1)
    a[1] = 0
    a[2] = rng.random(m) * 2 - 1
    return sp.csr_matrix(a)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("axis", [1, 0])
def test_row_and_column_extremes_against_scipy(target, op, axis):
    a = scipy_matrix(np.random.default_rng(34), 9, 7)
    stmt = f"y(i) = {op}(j, A(i,j))" if axis == 1 else f"y(j) = {op}(i, A(i,j))"
    k = ucf.compile(stmt, formats={"A": "csr"}, target=target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)  # the column max's CSC copy
        got = np.asarray(k(A=ucf.from_scipy(a)))
    want = getattr(a, op)(axis=axis).toarray().ravel()
    assert np.array_equal(got, want)


@needs_cc
def test_a_csr_row_max_walks_the_stored_entries_only():
    """The cliff of issue 34: a loop over every column of every row (20k x 20k: 720x
    scipy). A fill the max skips anyway (-inf) and sums keep their code."""
    src = ucf.compile("y(i) = max(j, A(i,j))", formats={"A": "csr"}, target="c").source
    assert "j < n_j" not in src
    assert "if ((max_j_seen < n_j))" in src
    for stmt, fmt in [("y(i) = max(j, A(i,j))", "csr fill=-inf"), ("y(i) = A(i,j)", "csr")]:
        assert "_seen" not in ucf.compile(stmt, formats={"A": fmt}, target="c").source


BODIES = {
    "A": lambda a, b, x: a,
    "A + 1": lambda a, b, x: a + 1,
    "A - x": lambda a, b, x: a - x,
    # An absent B is a structural 0 even beside a stored NaN (docs/language.md)
    "A * B": lambda a, b, x: np.where(b == 0, 0.0, a * b),
    "A * D": lambda a, b, x: a * b,
    "relu(A)": lambda a, b, x: np.where(a > 0, a, 0.0),  # relu(NaN) is 0 (the docs)
}
SPELLED = {
    "A": "A(i,j)",
    "A + 1": "A(i,j) + 1",
    "A - x": "A(i,j) - x(j)",
    "A * B": "A(i,j) * B(i,j)",
    "A * D": "A(i,j) * D(i,j)",
    "relu(A)": "relu(A(i,j))",
}


@st.composite
def cases(draw):
    fmt = draw(st.sampled_from(["csr", "csc", "dcsr", "coo", "dense"]))
    body = draw(st.sampled_from(sorted(BODIES)))
    # Fills other than 0 only where folding them is plain arithmetic (0 * inf, which
    # the structural rule takes as 0, is left out: docs/language.md).
    fills = [0.0] if fmt == "dense" or "*" in body else [0.0, -np.inf, np.inf, 2.0]
    return (
        draw(st.sampled_from(["max", "min"])),
        draw(st.sampled_from([1, 0])),
        fmt,
        body,
        draw(st.sampled_from(fills)),
        draw(st.integers(0, 5)),
        draw(st.integers(0, 5)),
        draw(st.floats(0, 1)),
        draw(st.booleans()),  # a stored NaN
        draw(st.integers(0, 2**31)),
    )


@settings(max_examples=30)
@given(cases(), st.sampled_from(["llvm", "c"]))
def test_extremes_against_numpy(case, target):
    op, axis, fmt, body, fill, n, m, density, nan, seed = case
    rng = np.random.default_rng(seed)
    a = np.full((n, m), fill)
    live = rng.random((n, m)) < density
    a[live] = rng.integers(-3, 4, size=live.sum())
    if n > 1 and m:
        a[rng.integers(n)] = rng.integers(-3, 4, size=m)  # likely a full row
    if nan and a.size:
        a[rng.integers(n), rng.integers(m)] = np.nan
    b = rng.integers(-3, 4, size=(n, m)).astype(float)
    x = rng.integers(-3, 4, size=m).astype(float)
    spelled = fmt + (f" fill={fill}" if fill else "")
    stmt = f"y({'i' if axis == 1 else 'j'}) = {op}({'j' if axis == 1 else 'i'}, {SPELLED[body]})"
    formats = {"A": spelled} | ({"B": "csr"} if body == "A * B" else {})
    ops = {"A": ucf.from_numpy(a, spelled)}
    if body == "A * B":
        b *= rng.random((n, m)) < 0.5
        ops["B"] = ucf.from_numpy(b, "csr")
    if body == "A * D":
        ops["D"] = b
    if body == "A - x":
        ops["x"] = x
    k = ucf.compile(stmt, formats=formats, target=target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)
        got = np.asarray(k(**ops))
    want = extreme(op, BODIES[body](a, b, x), axis)
    assert np.array_equal(got, want), (stmt, formats, a, got, want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", ["csr", "dcsr", "coo", "csc"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_integer_kernels(target, fmt, op):
    rng = np.random.default_rng(7)
    a = ((rng.random((6, 5)) < 0.4) * rng.integers(-9, 10, size=(6, 5))).astype(np.int32)
    a[1] = 0
    a[2] = rng.integers(1, 9, size=5)  # full and positive: no 0 folded in
    k = ucf.compile(f"y(i) = {op}(j, A(i,j))", formats={"A": fmt}, dtype="int32", target=target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)  # csc: a csr copy
        got = np.asarray(k(A=ucf.from_numpy(a, fmt)))
    assert got.dtype == np.int32
    assert np.array_equal(got, getattr(a, op)(axis=1))


NESTED = [
    ("s = max(i, sum(j, A(i,j)))", lambda a: a.sum(axis=1).max()),
    ("s = min(i, j, A(i,j))", lambda a: a.min()),
    ("y(i) = max(j, A(i,j)) - min(k, A(i,k))", lambda a: a.max(axis=1) - a.min(axis=1)),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", ["dcsr", "coo", "csr"])
@pytest.mark.parametrize(("stmt", "ref"), NESTED)
def test_nested_and_several_reductions(target, fmt, stmt, ref):
    rng = np.random.default_rng(11)
    a = (rng.random((6, 5)) < 0.3) * rng.integers(-9, 10, size=(6, 5)).astype(float)
    a[3] = 0  # an empty row: dcsr stores none of it
    k = ucf.compile(stmt, formats={"A": fmt}, target=target)
    assert np.array_equal(np.asarray(k(A=ucf.from_numpy(a, fmt))), ref(a))


@pytest.mark.parametrize("afmt", ["dcsr", "csr", "coo"])
def test_a_sparse_output_stores_every_row_with_an_extent(afmt):
    """Each row's max is over a non-empty extent, so it is stored (a zero where the row
    is empty), as before the rows were walked by their entries."""
    rng = np.random.default_rng(5)
    a = (rng.random((7, 6)) < 0.3) * rng.integers(-3, 4, size=(7, 6)).astype(float)
    a[1] = 0
    k = ucf.compile("y(i) = max(j, A(i,j))", formats={"A": afmt, "y": "C"})
    got = k(A=ucf.from_numpy(a, afmt))
    assert got.nnz == 7
    assert np.array_equal(got.to_numpy(), a.max(axis=1))


def test_schedules_over_the_reduced_loop():
    rng = np.random.default_rng(3)
    a = (rng.random((9, 11)) < 0.3) * rng.integers(-3, 4, size=(9, 11)).astype(float)
    schedules = [
        "split(j, j0, j1, 4)",
        "pos(j, jp, A); split(jp, j0, j1, 4)",
        "bound(j, jb, 11, MaxExact); unroll(jb, 2)",  # a bound loop still walks every j
        "split(j, j0, j1, 4); bound(j0, jb, 3, MaxExact)",
    ]
    for schedule in schedules:
        k = ucf.compile("y(i) = max(j, A(i,j))", formats={"A": "csr"}, schedule=schedule)
        assert np.array_equal(np.asarray(k(A=ucf.from_numpy(a, "csr"))), a.max(axis=1))


@pytest.mark.parametrize("fmt", ["csr", "dcsr"])
@pytest.mark.parametrize("stmt", ["y(i) = max(j, A(i,j))", "y(j) = min(i, A(i,j))"])
def test_the_cuda_emulator(fmt, stmt):
    rng = np.random.default_rng(9)
    a = (rng.random((6, 5)) < 0.4) * rng.integers(-3, 4, size=(6, 5)).astype(float)
    a[2] = 0
    k = ucf.compile(stmt, formats={"A": fmt}, target="cuda", emulate=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)
        got = np.asarray(k(A=ucf.from_numpy(a, fmt)))
    assert np.array_equal(got, a.max(axis=1) if "max" in stmt else a.min(axis=0))
