"""Flat passes (ucf.passes.flat_positions): a full sum, or a column sum, over compressed
levels loops over the stored positions directly, so its partial sums see the whole
tensor, not a row. Against numpy and scipy on both CPU targets, over empty rows,
zero-size and all-empty matrices, stored zeros, CSF and DCSR; bit for bit between the
targets and against the documented order of partial sums over the flat values (each
step rounded once, replayed in exact rational arithmetic); and under ASan."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from tests.asan import run_under_asan
from tests.helpers import TARGETS
from tests.helpers import documented_sum as _documented
from tests.passes.test_partial_sums import LENGTHS, _rows_matrix
from tests.statement_fuzz import Case, check

TOTAL = "s = A(i,j)"
TARGET_NAMES = [t if isinstance(t, str) else t.values[0] for t in TARGETS]


def _scalar(t) -> float:
    return float(t.to_numpy())


def _flat_sum(values: np.ndarray) -> float:
    """The documented order of a float64 sum of ``values`` taken as one loop."""
    return _documented([(float(v), 1.0) for v in values], 4)


@pytest.mark.parametrize("fmt", ["csr", "dcsr"])
def test_total_is_one_loop_in_the_documented_order(fmt):
    m = _rows_matrix(np.random.default_rng(5), LENGTHS, 80, np.float64)
    got = {}
    for target in TARGET_NAMES:
        k = ucf.compile(TOTAL, formats={"A": fmt}, target=target)
        assert "flat pass: loop i" in k.cin and "partial sums" in k.cin
        got[target] = _scalar(k(A=ucf.from_scipy(m, format=fmt)))
    want = _flat_sum(m.data)
    assert all(g == want for g in got.values()), (got, want)
    assert want == pytest.approx(m.data.sum(), rel=1e-12)


def test_csf_total_flattens_every_level():
    rng = np.random.default_rng(2)
    dense = rng.standard_normal((6, 5, 7)) * (rng.random((6, 5, 7)) < 0.3)
    dense[2] = 0.0  # an empty slice
    t = ucf.from_numpy(dense, format="csf")
    for target in TARGET_NAMES:
        k = ucf.compile("s = A(i,j,k)", formats={"A": "csf"}, target=target)
        assert k.cin.count("flat pass") == 2
        assert _scalar(k(A=t)) == _flat_sum(dense[dense != 0])


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (4, 6)])
def test_zero_size_and_empty(shape):
    m = sp.csr_matrix(shape)
    k = ucf.compile(TOTAL, formats={"A": "csr"})
    assert _scalar(k(A=ucf.from_scipy(m, format="csr"))) == 0.0


def test_stored_zeros_and_column_sums():
    m = _rows_matrix(np.random.default_rng(8), [3, 0, 20, 1, 0, 5], 30, np.float64)
    m.data[::3] = 0.0  # stored zeros stay entries
    a = ucf.from_scipy(m, format="csr")
    assert a.to_scipy().nnz == m.nnz
    for target in TARGET_NAMES:
        col = ucf.compile("y(j) = A(i,j)", formats={"A": "csr"}, target=target)
        assert "flat pass" not in col.cin  # it scatters through a coordinate: rows stay
        np.testing.assert_allclose(col(A=a), np.asarray(m.sum(axis=0)).ravel(), rtol=1e-12)
        row = ucf.compile("y(i) = A(i,j)", formats={"A": "csr"}, target=target)
        assert "flat pass" not in row.cin  # each row's sum is stored in its row
        np.testing.assert_allclose(row(A=a), np.asarray(m.sum(axis=1)).ravel(), rtol=1e-12)


def test_a_gather_through_coordinates_keeps_its_rows():
    """``s = A(i,j)*x(j)`` reads x at A's coordinates: its rows keep their chains (a sum
    carried across rows, tests/passes/test_partial_sums.py)."""
    assert "flat pass" not in ucf.compile("s = A(i,j)*x(j)", formats={"A": "csr"}).cin


def test_a_parallel_row_loop_keeps_its_rows():
    k = ucf.compile(
        "y(j) = A(i,j)",
        formats={"A": "csr"},
        schedule="parallelize(i,CPUThread,Atomics)",
    )
    assert "flat pass" not in k.cin


@settings(max_examples=25)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    seed=st.integers(0, 2**16),
)
def test_total_hypothesis(lengths, seed):
    m = _rows_matrix(np.random.default_rng(seed), lengths, 45, np.float64)
    k = ucf.compile(TOTAL, formats={"A": "csr"})
    assert _scalar(k(A=ucf.from_scipy(m, format="csr"))) == _flat_sum(m.data)


@pytest.mark.parametrize("target", TARGETS)
def test_a_dropped_guard_is_never_taken_for_a_loop(target, threads):
    """Flattening an outer loop drops the guard of the loop flattened below it; its id,
    freed, went to a loop made later, which the pass then took for a guard (an
    AttributeError in ``Kernel.__init__``: the statement fuzz, seed 1 case 272, against
    its numpy reference)."""
    A = ("acc", "A", ("k", "i", "l"))
    tree = ("-", ("*", ("lit", -1), A), ("fn", "max", (A, ("acc", "A", ("j", "i", "l")))))
    expr = "X(j) = ((-1) * (A(k,i,l))) - (max(A(k,i,l), A(j,i,l)))"
    extents = {"i": 3, "j": 1, "k": 1, "l": 1}
    formats = {"A": "CCCF1:1,0/1,2,0%1"}
    check(
        Case(
            expr,
            tree,
            {"A": ["j", "i", "l"]},
            ["j"],
            extents,
            formats,
            "CU:0/1,0%1",
            153798012,
            0.7,
            target,
        )
    )


def test_total_under_asan(asan_cc, tmp_path):
    m = _rows_matrix(np.random.default_rng(4), [0, 9, 1, 17, 0, 30, 2], 40, np.float64)
    k = ucf.compile(TOTAL, formats={"A": "csr"}, target="c")
    ops = {"A": ucf.from_scipy(m, format="csr")}
    out = run_under_asan(asan_cc, tmp_path, k, "", (), {"i": 7, "j": 40}, ops)
    assert float(out.to_numpy()) == _flat_sum(m.data)
