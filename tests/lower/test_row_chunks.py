"""One-pass outputs built by rows in parallel (``ucf.lower.row_chunks``): a sparse add
and a Gustavson product whose rows are cut into chunks of about equal bound, each
chunk appending into its own region of the bounded output, the regions then moved
together. Checked against scipy on llvm and c, on one thread and two, over empty rows,
empty matrices, one dense row and power-law rows; bit for bit against the one-thread
plan and across targets; the exact count above the cap; and under ASan with OpenMP
on two threads, where the bound is tight (every product its own entry, patterns that
never meet) so a chunk that wrote past its region would be caught."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.asan import run_under_asan
from tests.helpers import CC, TARGETS, rand_sparse
from ucf.lower import product_bound

ADD = "C(i,j) = A(i,j) + B(i,j)"
PRODUCT = "C(i,k) = A(i,j) * B(j,k)"
GUSTAVSON = "precompute(A(i,j)*B(j,k),k,k,w)"
SERIAL = {ADD: "reorder(i,j)", PRODUCT: GUSTAVSON}
PARALLEL = {
    ADD: "parallelize(i,CPUThread,NoRaces)",
    PRODUCT: GUSTAVSON + "; parallelize(i,CPUThread,NoRaces)",
}
ONE_PASS = "appended in one pass"
CASES = ["random", "empty rows", "no entries", "no rows", "one dense row", "power-law"]


def operands(case: str, expr: str) -> tuple[np.ndarray, np.ndarray]:
    """A and B of small positive integers (sums exact in any order; nothing cancels)."""
    rng = np.random.default_rng(len(case) + len(expr))
    n, m = (0, 40) if case == "no rows" else (300, 40)
    p = 40 if expr == ADD else 90
    a = rand_sparse(
        rng, (n, m), 0.08, empty_rows=n // 3 if case == "empty rows" else 3, signed=False
    )
    b = rand_sparse(rng, (n if expr == ADD else m, p), 0.08, empty_rows=3, signed=False)
    if case == "no entries":
        a[:] = 0
    if case == "one dense row":
        a[7] = rng.integers(1, 5, m)
    if case == "power-law":  # row r holds about 40 / (r + 1) entries
        a[:] = 0
        for r in range(n):
            k = max(1, int(m / (r + 1) ** 0.8))
            a[r, rng.choice(m, k, replace=False)] = rng.integers(1, 5, k)
    return a, b


def reference(expr: str, a, b):
    return a + b if expr == ADD else a @ b


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("expr", [ADD, PRODUCT])
@pytest.mark.parametrize("case", CASES)
def test_parallel_rows_against_scipy(target, expr, case, threads):
    a, b = operands(case, expr)
    k = ucf.compile(expr, formats={t: "csr" for t in "ABC"}, schedule=PARALLEL[expr], target=target)
    assert ONE_PASS in k.cin
    got = k(A=sp.csr_matrix(a), B=sp.csr_matrix(b))
    got.validate()  # sorted, unique, positions that rise
    np.testing.assert_array_equal(got.to_numpy(), reference(expr, a, b))
    want = sp.csr_matrix(reference(expr, a, b))
    assert len(got.vals) == len(got.levels[1]["crd"]) == want.nnz


@pytest.mark.parametrize("expr", [ADD, PRODUCT])
def test_parallel_rows_give_the_one_thread_plans_bits_on_both_targets(expr, threads):
    """Random values (rounding follows the order of each row's sums): the parallel plan
    gives the bits of the serial plan, and llvm those of c."""
    if CC is None:
        pytest.skip("needs a C compiler")
    rng = np.random.default_rng(8)
    a = sp.random(700, 500, 0.02, "csr", random_state=rng)
    b = sp.random(*((700, 500) if expr == ADD else (500, 600)), 0.02, "csr", random_state=rng)
    got = {
        (t, s): ucf.compile(
            expr, formats={x: "csr" for x in "ABC"}, schedule=sched[expr], target=t
        )(A=a, B=b).to_scipy()
        for t in ("llvm", "c")
        for s, sched in (("serial", SERIAL), ("parallel", PARALLEL))
    }
    first = got[("llvm", "serial")]
    assert abs(first - reference(expr, a, b)).max() <= 1e-12
    for c in got.values():
        for x in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(c, x), getattr(first, x))


@pytest.mark.parametrize("out", ["UQ", "dcsr"])
def test_unordered_rows_and_a_dcsr_output(out, threads):
    """A product into unordered rows (scipy's contract) appends in chunks too; a DCSR
    output has no dense row level to share out (parallelize refuses it), and its
    default holds the product as well."""
    a, b = operands("power-law", PRODUCT)
    schedule = PARALLEL[PRODUCT] if out == "UQ" else None
    k = ucf.compile(PRODUCT, formats={"A": "csr", "B": "csr", "C": out}, schedule=schedule)
    assert (ONE_PASS in k.cin) == (out == "UQ")
    got = k(A=sp.csr_matrix(a), B=sp.csr_matrix(b))
    np.testing.assert_array_equal(got.to_numpy(), a @ b)


@pytest.mark.parametrize("target", TARGETS)
def test_above_the_cap_parallel_rows_count_exactly(target, monkeypatch, tmp_path, threads):
    """Above ``CAP`` products the arrays hold exactly the entries, and the rows' regions
    start at exact counts: the output fills them with no room left."""
    monkeypatch.setattr(product_bound, "CAP", 10)
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    a, b = operands("one dense row", PRODUCT)
    k = ucf.compile(
        PRODUCT, formats={t: "csr" for t in "ABC"}, schedule=PARALLEL[PRODUCT], target=target
    )
    got = k(A=sp.csr_matrix(a), B=sp.csr_matrix(b))
    got.validate()
    np.testing.assert_array_equal(got.to_numpy(), a @ b)
    crd = got.levels[1]["crd"]
    assert crd.base is None or crd.base.nbytes == crd.nbytes


def tight(expr: str) -> tuple[np.ndarray, np.ndarray]:
    """Operands whose bound is the output's size: each product a distinct entry (B's
    rows on columns of their own), or patterns that never meet."""
    rng = np.random.default_rng(2)
    a = rand_sparse(rng, (200, 30), 0.2, empty_rows=20, signed=False)
    if expr == ADD:
        b = rand_sparse(rng, (200, 30), 0.2, empty_rows=20, signed=False)
        b[a != 0] = 0
        return a, b
    b = np.zeros((30, 90))
    for j in range(30):
        b[j, 3 * j : 3 * j + rng.integers(0, 4)] = rng.integers(1, 5)
    return a, b


@pytest.mark.parametrize(
    "expr,case,cap",
    [
        (ADD, "tight", None),
        (ADD, "power-law", None),
        (PRODUCT, "tight", None),
        (PRODUCT, "power-law", None),
        (PRODUCT, "tight", 0),
    ],
)
def test_chunks_stay_in_their_regions_under_asan(asan_cc, monkeypatch, tmp_path, expr, case, cap):
    """Built with OpenMP on two threads (the second starts its chunks at their bound's
    prefix) with every buffer exactly sized: no chunk writes past its region, and the
    move leaves the result; ``cap`` 0 takes the exact count's prefix. (A chunk started
    one entry late fails here.)"""
    if cap is not None:
        monkeypatch.setattr(product_bound, "CAP", cap)
        monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path / "cache"))
    a, b = tight(expr) if case == "tight" else operands(case, expr)
    k = ucf.compile(expr, formats={t: "csr" for t in "ABC"}, schedule=PARALLEL[expr], target="c")
    ops = {"A": ucf.from_numpy(a, format="csr"), "B": ucf.from_numpy(b, format="csr")}
    want = reference(expr, a, b)
    ext = (
        {"i": a.shape[0], "j": a.shape[1]}
        if expr == ADD
        else {"i": a.shape[0], "j": a.shape[1], "k": b.shape[1]}
    )
    out = run_under_asan(asan_cc, tmp_path, k, "csr", want.shape, ext, ops, threads=2)
    out.validate()
    np.testing.assert_array_equal(out.to_numpy(), want)
    if case == "tight":
        assert len(out.vals) == np.count_nonzero(want)


@pytest.mark.parametrize("expr", [ADD, PRODUCT])
def test_rows_a_split_shares_out_run_in_chunks(expr, threads):
    """Skewed rows go out in blocks of a split (as the default shares them); one-pass
    rows run in chunks of about equal bound instead, and hold scipy's result."""
    a, b = operands("power-law", expr)
    split = "split(i,i_c,i_r,16); parallelize(i_c,CPUThread,NoRaces)"
    schedule = split if expr == ADD else f"{GUSTAVSON}; {split}"
    k = ucf.compile(expr, formats={t: "csr" for t in "ABC"}, schedule=schedule)
    assert ONE_PASS in k.cin and "chunks of about equal bound" in k.cin
    got = k(A=sp.csr_matrix(a), B=sp.csr_matrix(b))
    got.validate()
    np.testing.assert_array_equal(got.to_numpy(), reference(expr, a, b))
