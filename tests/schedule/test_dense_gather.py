"""The default's dense gather of a sparse vector (ucf.schedule.dense_gather): an SpMV
with a compressed x gathers x into a dense workspace once instead of merging it with
every row. Against scipy on both CPU targets, over empty rows, an empty and a full
x, stored zeros, zero-size operands, x read twice, and the model's comparison of the
estimates with a call's statistics."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.asan import run_under_asan
from tests.helpers import TARGETS
from ucf import pipeline
from ucf.format.format import parse_format
from ucf.schedule.stats import Stats

SPMV = "y(i) = A(i,j)*x(j)"
GATHERED = "the sparse vector x is gathered into a dense workspace over j"


def _x(n: int, density: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n) * (rng.random(n) < density)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", ["csr", "dcsr"])
def test_spmv_sparse_x_gathers(target, fmt):
    m = sp.random(60, 50, density=0.1, format="csr", random_state=3)
    m = m.tolil()
    m[5, :] = 0  # an empty row
    m = m.tocsr()
    m.eliminate_zeros()
    k = ucf.compile(SPMV, formats={"A": fmt, "x": "C"}, target=target)
    assert GATHERED in k.cin
    a = ucf.from_scipy(m, format=fmt)
    for density, seed in [(0.0, 1), (0.2, 2), (1.0, 3)]:
        xd = _x(50, density, seed)
        x = ucf.from_numpy(xd, format="C")
        np.testing.assert_allclose(k(A=a, x=x).to_numpy(), m @ xd, rtol=1e-12, atol=1e-14)


def test_stored_zeros_in_x_and_zero_size():
    k = ucf.compile(SPMV, formats={"A": "csr", "x": "C"})
    m = sp.random(8, 6, density=0.5, format="csr", random_state=1)
    xv = ucf.from_coo([[1], [4]], [0.0, 2.0], shape=(6,), format="C")  # a stored zero
    assert xv.nnz == 2
    xd = np.array([0, 0, 0, 0, 2.0, 0])
    np.testing.assert_allclose(k(A=m, x=xv).to_numpy(), m @ xd, rtol=1e-12)
    empty = sp.csr_matrix((0, 6))
    assert k(A=empty, x=xv).to_numpy().shape == (0,)
    none = sp.csr_matrix((4, 0))
    np.testing.assert_array_equal(
        k(A=none, x=ucf.from_numpy(np.zeros(0), format="C")).to_numpy(), np.zeros(4)
    )


def test_x_read_twice_and_column_order_kept():
    m = sp.random(30, 30, density=0.2, format="csr", random_state=7)
    xd = _x(30, 0.3, 4)
    x = ucf.from_numpy(xd, format="C")
    twice = ucf.compile("y(i) = A(i,j)*x(j)*x(j)", formats={"A": "csr", "x": "C"})
    np.testing.assert_allclose(twice(A=m, x=x).to_numpy(), m @ (xd * xd), rtol=1e-12)
    # stored by column, j is outermost: x is merged once, nothing to gather
    csc = ucf.compile(SPMV, formats={"A": "csc", "x": "C"})
    assert GATHERED not in csc.cin
    np.testing.assert_allclose(csc(A=m.tocsc(), x=x).to_numpy(), m @ xd, rtol=1e-12)


def test_the_model_compares_the_estimates():
    fmts = {"A": parse_format("csr"), "x": parse_format("C")}
    many = Stats({"i": 20000, "j": 20000}, {"A": 200000, "x": 200})
    few = Stats({"i": 2, "j": 1_000_000}, {"A": 20, "x": 200})
    assert "precompute(x(j), j, j)" in pipeline.proposals(SPMV, fmts, many, 1)[0].text
    chosen = pipeline.proposals(SPMV, fmts, few, 1)[0]
    assert "precompute" not in chosen.text
    assert any("is merged with each (i) (2 x 200 steps)" in w for w in chosen.why)


def test_spmv_sparse_x_under_asan(asan_cc, tmp_path):
    m = sp.random(7, 9, density=0.4, format="csr", random_state=2)
    xd = _x(9, 0.4, 5)
    k = ucf.compile(SPMV, formats={"A": "csr", "x": "C"}, target="c")
    assert GATHERED in k.cin
    ops = {"A": ucf.from_scipy(m, format="csr"), "x": ucf.from_numpy(xd, format="C")}
    out = run_under_asan(asan_cc, tmp_path, k, "U", (7,), {"i": 7, "j": 9}, ops)
    np.testing.assert_allclose(out.to_numpy(), m @ xd, rtol=1e-12)
