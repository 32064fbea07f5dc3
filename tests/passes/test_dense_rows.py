"""Rows of dense operands summed or reduced into scalars (GEMV ``A @ x``, row sums, row
maxima and minima): 4 rows side by side (``ucf.passes.row_groups``, serial loops too
when every operand is dense), each row's sum or max in partial sums
(``ucf.passes.partial_sums``). Against numpy, and in float64 bit for bit against the
documented order replayed exactly, on shapes that leave rows out of the groups and
terms out of the blocks, in float and integer types, on llvm and c, on one thread and
two; bit for bit the kernel without row groups; under ASan."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from tests.asan import run_under_asan
from tests.helpers import TARGETS, documented_sum, rand_dense

GEMV = "y(i) = A(i,j) * x(j)"
REDUCTIONS = [
    ("y(i) = max(j, A(i,j))", lambda a: a.max(axis=1)),
    ("y(i) = min(j, A(i,j))", lambda a: a.min(axis=1)),
    ("y(i) = A(i,j)", lambda a: a.sum(axis=1)),
]
# (rows, columns): none, one, rows left out of every group of 4 and rows too short to
# split (< 16 float64 terms), rows split with a remainder of terms, empty rows.
SHAPES = [(0, 5), (1, 1), (7, 7), (9, 40), (33, 33), (37, 130), (6, 0)]


@pytest.mark.parametrize("target", TARGETS)
def test_gemv_in_the_documented_order(target, threads):
    rng = np.random.default_rng(4)
    k = ucf.compile(GEMV, target=target)
    for m, n in SHAPES:
        a, x = rng.standard_normal((m, n)), rng.standard_normal(n)
        got = np.asarray(k(A=a, x=x))
        want = [documented_sum(list(zip(a[r], x, strict=True)), 4) for r in range(m)]
        assert np.array_equal(got, np.array(want).reshape(m)), (m, n)
    assert "row groups: 4 rows (i)" in k.cin


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
@pytest.mark.parametrize(("expr", "ref"), REDUCTIONS, ids=["max", "min", "sum"])
def test_row_reductions_match_numpy(target, dtype, expr, ref):
    rng = np.random.default_rng(8)
    k = ucf.compile(expr, dtype=dtype, target=target)
    for m, n in SHAPES:
        if n == 0 and "(j," in expr:
            continue  # numpy refuses the max of nothing; ucf gives the identity
        a = rand_dense(rng, (m, n), dtype, low=-50, high=50)
        np.testing.assert_array_equal(np.asarray(k(A=a)), ref(a))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_partial_maxima_skip_nans_and_keep_infinities(target, dtype, op):
    """Rows long enough to split (130 terms) with NaNs in every lane position, a NaN
    first and last, infinities of both signs, rows all NaN or all of one infinity, and
    zeros of both signs: the max (min) skips a NaN as one chain does (a row of NaNs
    gives the identity), against numpy's ``nanmax`` (``nanmin``)."""
    rng = np.random.default_rng(21)
    a = rng.standard_normal((12, 130)).astype(dtype)
    a[0, ::7] = np.nan
    a[1, 0] = a[1, -1] = np.nan
    a[2, 5], a[2, 77] = np.inf, -np.inf
    a[3, :] = np.nan
    a[4, :] = -np.inf
    a[5, :] = np.inf
    a[6, :] = 0.0
    a[6, ::2] = -0.0
    a[7, :] = -(np.abs(a[7]) + 1)  # all negative: a partial maximum must not start at 0
    a[8, :] = np.abs(a[8]) + 1
    a[9, :-1] = np.nan  # one number after 129 NaNs, in the remainder
    identity = -np.inf if op == "max" else np.inf
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
        want = (np.nanmax if op == "max" else np.nanmin)(a, axis=1)
    want[3] = identity
    k = ucf.compile(f"y(i) = {op}(j, A(i,j))", dtype=dtype, target=target)
    assert f"the {op} over j" in k.cin
    np.testing.assert_array_equal(np.asarray(k(A=a)), want)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("expr", [GEMV, REDUCTIONS[0][0], REDUCTIONS[2][0]])
def test_groups_change_no_bit(monkeypatch, dtype, expr):
    """Random floats: the kernel with row groups equals the one without
    (``UCF_REGISTER_BLOCKING=0``) bit for bit, and llvm equals c; the max in partial
    maxima reads the same as numpy's."""
    rng = np.random.default_rng(12)
    ops = {"A": rng.standard_normal((37, 130)).astype(dtype)}
    if "x(j)" in expr:
        ops["x"] = rng.standard_normal(130).astype(dtype)
    got = {t: np.asarray(ucf.compile(expr, dtype=dtype, target=t)(**ops)) for t in ("llvm", "c")}
    monkeypatch.setenv("UCF_REGISTER_BLOCKING", "0")
    plain = ucf.compile(expr, dtype=dtype)
    assert "row groups" not in plain.cin
    assert np.array_equal(got["llvm"], got["c"])
    assert np.array_equal(got["llvm"], np.asarray(plain(**ops)))
    if "max" in expr:
        assert np.array_equal(got["llvm"], ops["A"].max(axis=1))


@pytest.mark.parametrize("target", TARGETS)
def test_rows_inside_a_sum_are_grouped(target, monkeypatch):
    """A loop over rows inside one that sums (``y(i) = A(b,i,j) * x(j)`` over b, i, j):
    for each b its rows are independent (``ucf.lower.parallel.mark_independent`` marks
    a loop wherever it stands), so they run 4 at a time; against numpy, and bit for bit
    the kernel without groups."""
    rng = np.random.default_rng(5)
    a, x = rng.standard_normal((3, 37, 40)), rng.standard_normal(40)
    expr, schedule = "y(i) = A(b,i,j) * x(j)", "reorder(b,i,j)"
    k = ucf.compile(expr, schedule=schedule, target=target)
    got = np.asarray(k(A=a, x=x))
    assert "row groups: 4 rows (i)" in k.cin
    np.testing.assert_allclose(got, np.einsum("bij,j->i", a, x), rtol=1e-12)
    monkeypatch.setenv("UCF_REGISTER_BLOCKING", "0")
    plain = ucf.compile(expr, schedule=schedule, target=target)
    assert "row groups" not in plain.cin
    assert np.array_equal(got, np.asarray(plain(A=a, x=x)))


def test_partial_maxima_are_in_kcin():
    k = ucf.compile(REDUCTIONS[0][0])
    assert "partial sums: the max over j into max_j_g0, max_j_g1" in k.cin, k.cin


@settings(max_examples=15)
@given(st.integers(0, 12), st.integers(0, 90), st.sampled_from(["gemv", "max"]))
def test_rows_fuzzed(m, n, what):
    rng = np.random.default_rng(m * 1009 + n)
    a = rng.standard_normal((m, n))
    if what == "gemv":
        x = rng.standard_normal(n)
        want = [documented_sum(list(zip(a[r], x, strict=True)), 4) for r in range(m)]
        assert np.array_equal(np.asarray(ucf.compile(GEMV)(A=a, x=x)), np.array(want).reshape(m))
    elif n:
        got = np.asarray(ucf.compile(REDUCTIONS[0][0])(A=a))
        assert np.array_equal(got, a.max(axis=1))


@pytest.mark.parametrize("expr", [GEMV, REDUCTIONS[0][0]])
def test_groups_stay_in_bounds_under_asan(asan_cc, tmp_path, expr):
    """37 rows (9 groups of 4 and 1 more), 130 float32 terms (16 blocks of 8 and 2)."""
    rng = np.random.default_rng(13)
    a = rng.standard_normal((37, 130)).astype(np.float32)
    ops = {"A": ucf.from_numpy(a, dtype="float32")}
    if "x(j)" in expr:
        ops["x"] = ucf.from_numpy(rng.standard_normal(130).astype(np.float32), dtype="float32")
    k = ucf.compile(expr, dtype="float32", target="c")
    assert "row groups" in k.cin
    out = run_under_asan(asan_cc, tmp_path, k, "U", (37,), {"i": 37, "j": 130}, ops)
    np.testing.assert_array_equal(out.to_numpy(), np.asarray(k(**ops)))
