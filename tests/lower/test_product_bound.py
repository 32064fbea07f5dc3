"""A Gustavson product appended in one pass (``ucf.lower.product_bound``): the
output's arrays sized by the count of products, rows appended one after the other, the
arrays trimmed once. Checked against scipy on empty rows, one long row, rows that
overlap (many products, few entries: the trim copies), wide and narrow operands,
float32, float64 and int64, both CPU targets bit for bit, the exact count above the
cap, the default at one thread, and with hypothesis."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from tests.asan import run_under_asan
from tests.helpers import TARGETS, arrival_operands, rand_sparse
from ucf.lower import product_bound

STMT = "C(i,k) = A(i,j) * B(j,k)"
SERIAL = "precompute(A(i,j)*B(j,k),k,k,w)"
PARALLEL = SERIAL + "; parallelize(i,CPUThread,NoRaces)"
ONE_PASS = "appended in one pass"


positive = partial(rand_sparse, signed=False)


def operands(case: str, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """A and B of one shape of product, of positive values (scipy drops the sums that
    cancel to zero; ucf stores every entry the pattern implies)."""
    rng = np.random.default_rng(len(case))

    if case == "wide":  # few rows, many columns of C
        return positive(rng, (7, 40), 0.3, dtype), positive(rng, (40, 900), 0.05, dtype)
    if case == "narrow":  # C with 3 columns
        return positive(rng, (60, 25), 0.3, dtype), positive(rng, (25, 3), 0.5, dtype)
    if case == "overlap":  # every row of B alike: 30 products per entry of C
        a = positive(rng, (40, 30), 1.0, dtype, empty_rows=3)
        b = np.tile(positive(rng, (1, 50), 0.4, dtype, empty_rows=0), (30, 1))
        return a, b
    if case == "one long row":
        a = np.zeros((9, 200), dtype)
        a[4] = positive(rng, (1, 200), 1.0, dtype, empty_rows=0)
        return a, positive(rng, (200, 300), 0.05, dtype)
    if case == "empty":
        return np.zeros((5, 4), dtype), positive(rng, (4, 6), 0.5, dtype)
    return positive(rng, (50, 40), 0.1, dtype, empty_rows=5), positive(
        rng, (40, 70), 0.1, dtype, empty_rows=5
    )


def compiled(schedule: str, target: str, out: str = "csr", dtype: str = "float64"):
    formats = {"A": "csr", "B": "csr", "C": out}
    return ucf.compile(STMT, formats=formats, schedule=schedule, target=target, dtype=dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", ["random", "wide", "narrow", "overlap", "one long row", "empty"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64])
def test_one_pass_product_against_scipy(target, case, dtype):
    A, B = operands(case, dtype)
    k = compiled(SERIAL, target, dtype=np.dtype(dtype).name)
    assert ONE_PASS in k.cin
    got = k(A=sp.csr_matrix(A), B=sp.csr_matrix(B))
    got.validate()  # sorted, unique columns
    want = sp.csr_matrix(A) @ sp.csr_matrix(B)
    want.sort_indices()
    c = got.to_scipy()
    np.testing.assert_array_equal(c.indptr, want.indptr)
    np.testing.assert_array_equal(c.indices, want.indices)
    np.testing.assert_array_equal(c.data, want.data)  # small integers: exact
    crd = got.levels[1]["crd"]
    if case == "overlap":  # 30 products an entry: the result does not hold the bound
        assert crd.base is None and got.vals.base is None
    assert len(crd) == len(got.vals) == want.nnz


def test_both_targets_agree_bit_for_bit_and_unordered_rows_hold_the_entries():
    """Random values (rounding differs by order): llvm and c give the same bits, and an
    unordered output (scipy's contract) the same entries in workspace order."""
    rng = np.random.default_rng(3)
    a = sp.random(300, 200, 0.05, "csr", random_state=rng)
    b = sp.random(200, 400, 0.05, "csr", random_state=rng)
    got = {t: compiled(SERIAL, t)(A=a, B=b).to_scipy() for t in ("llvm", "c")}
    for x in ("indptr", "indices", "data"):
        np.testing.assert_array_equal(getattr(got["llvm"], x), getattr(got["c"], x))
    assert abs(got["llvm"] - a @ b).max() <= 1e-12
    uq = compiled(SERIAL, "llvm", out="UQ")
    assert ONE_PASS in uq.cin
    c = uq(A=a, B=b).to_scipy()
    c.sort_indices()
    np.testing.assert_array_equal(c.indices, got["llvm"].indices)
    np.testing.assert_array_equal(c.data, got["llvm"].data)


def test_the_arrival_orders_of_the_row_sort():
    """Rows that take each way of the sort (short, ranked, bucketed, radix, sorted,
    reversed, bunched, the full row), appended in one pass."""
    a, b = arrival_operands(np.random.default_rng(9), 5000)
    k = compiled(SERIAL, "llvm")
    got = k(A=a, B=b)
    got.validate()
    want = a @ b
    want.sort_indices()
    np.testing.assert_array_equal(got.to_scipy().indices, want.indices)
    np.testing.assert_array_equal(got.to_scipy().data, want.data)


@pytest.mark.parametrize("target", TARGETS)
def test_above_the_cap_the_assemble_pass_counts(target, monkeypatch, tmp_path):
    """With more products than ``CAP``, the arrays are sized by an exact count: the
    output holds no room beyond its entries. A fresh cache compiles the lowered cap."""
    monkeypatch.setattr(product_bound, "CAP", 10)
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    A, B = operands("overlap")
    k = compiled(SERIAL, target)
    assert "above 10 products" in k.cin
    got = k(A=sp.csr_matrix(A), B=sp.csr_matrix(B))
    got.validate()
    np.testing.assert_array_equal(got.to_numpy(), A @ B)
    crd = got.levels[1]["crd"]
    assert crd.base is None or crd.base.nbytes == crd.nbytes


@pytest.mark.parametrize("case", ["overlap", "one long row", "empty"])
def test_the_exact_count_stays_in_bounds(asan_cc, monkeypatch, tmp_path, case):
    """The count above the cap marks columns in an array of its own: under ASan, with
    every operand buffer exactly sized (the bound's walk is covered by the Gustavson
    tests of tests/toolchain/test_asan.py)."""
    monkeypatch.setattr(product_bound, "CAP", 0)
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path / "cache"))
    A, B = operands(case)
    k = compiled(SERIAL, "c")
    ops = {"A": ucf.from_numpy(A, format="csr"), "B": ucf.from_numpy(B, format="csr")}
    (n, m), p = A.shape, B.shape[1]
    out = run_under_asan(asan_cc, tmp_path, k, "csr", (n, p), {"i": n, "j": m, "k": p}, ops)
    out.validate()
    np.testing.assert_array_equal(out.to_numpy(), A @ B)


def test_parallel_rows_append_in_one_pass_and_other_shapes_are_left_alone():
    """Rows built in parallel append in one pass too, in chunks of their own
    (``ucf.lower.row_chunks``, tested there); a product
    of a vector, or one that also adds, is no Gustavson product of rows."""
    assert ONE_PASS in compiled(PARALLEL, "llvm").cin
    k = ucf.compile(
        "C(i,k) = A(i,j) * B(j,k) + D(i,k)",
        formats={"A": "csr", "B": "csr", "C": "csr", "D": "csr"},
        schedule="precompute(A(i,j)*B(j,k),k,k,w)",
    )
    assert ONE_PASS not in k.cin
    k = ucf.compile(STMT, formats={"A": "csr", "B": "csc", "C": "csr"}, schedule=SERIAL)
    assert ONE_PASS not in k.cin


def test_the_default_appends_in_one_pass_on_one_thread_and_two():
    """The plan for one thread of the default SpGEMM is the serial workspace, in one
    pass; at two threads its rows run in parallel, in one pass too. Both give scipy's
    product."""
    rng = np.random.default_rng(4)
    a = sp.random(20000, 20000, 5e-4, "csr", random_state=rng)  # above REPLAN_WORK
    k = ucf.compile(STMT, formats={"A": "csr", "B": "csr", "C": "csr"})
    for threads in (1, 2):
        ucf.set_num_threads(threads)
        for _ in range(3):
            got = k(A=a, B=a)
            assert abs(got.to_scipy() - a @ a).max() <= 1e-12
        assert ONE_PASS in k.cin
        assert ("parallelize" in k.schedule_used) == (threads == 2)


@settings(max_examples=30)
@given(
    n=st.integers(1, 30),
    m=st.integers(1, 30),
    p=st.integers(1, 60),
    da=st.floats(0.0, 1.0),
    db=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_fuzz_one_pass_product(n, m, p, da, db, seed):
    rng = np.random.default_rng(seed)
    A = rand_sparse(rng, (n, m), da, empty_rows=0)
    B = rand_sparse(rng, (m, p), db, empty_rows=0)
    got = compiled(SERIAL, "llvm")(A=sp.csr_matrix(A), B=sp.csr_matrix(B))
    got.validate()
    np.testing.assert_array_equal(got.to_numpy(), A @ B)
    assert len(got.vals) == np.count_nonzero((A != 0).astype(int) @ (B != 0).astype(int))
