"""Chains of products' workspaces under AddressSanitizer (``tests/toolchain/test_asan.py``
says how): the default's one-dimensional ones of ``A@B@C@x`` and the two-dimensional
one of ``A@B@X``, on rectangular and empty operands."""

from __future__ import annotations

import numpy as np
import pytest

import ucf
from tests.asan import run_under_asan
from tests.toolchain.test_asan import MATS, _tensor


@pytest.mark.parametrize("case", list(MATS))
@pytest.mark.parametrize("fa,fb", [("csr", "csr"), ("dcsr", "csc")])
def test_chain_workspaces_stay_in_bounds(asan_cc, tmp_path, case, fa, fb):
    """The default's workspaces of a chain (w(k) = C@x, then w1(j) = B@w, outside the
    loop over i) stay inside their buffers, on rectangular and empty operands."""
    A = MATS[case]
    B = np.roll(A, 1, axis=0).T.copy()
    C = A.copy()
    x = np.arange(1, A.shape[1] + 1, dtype=np.float64)
    k = ucf.compile(
        "y(i) = A(i,j)*B(j,k)*C(k,l)*x(l)", formats={"A": fa, "B": fb, "C": fa}, target="c"
    )
    assert "precomputed into workspace w1" in k.cin, k.cin
    ops = {"A": _tensor(A, fa), "B": _tensor(B, fb), "C": _tensor(C, fa), "x": _tensor(x, "U")}
    n, m = A.shape
    extents = {"i": n, "j": m, "k": n, "l": m}
    out = run_under_asan(asan_cc, tmp_path, k, "U", (n,), extents, ops)
    np.testing.assert_array_equal(out.to_numpy(), A @ (B @ (C @ x)))


@pytest.mark.parametrize("case", list(MATS))
@pytest.mark.parametrize("cols", [1, 3])
def test_a_2d_chain_workspace_stays_in_bounds(asan_cc, tmp_path, case, cols):
    """The default's two-dimensional workspace of A@B@X (w(j,l) = B@X, outside the loop
    over i) stays inside its buffer, on rectangular and empty operands."""
    A = MATS[case]
    B = np.roll(A, 1, axis=0).T.copy()
    X = np.arange(1, A.shape[0] * cols + 1, dtype=np.float64).reshape(A.shape[0], cols)
    k = ucf.compile("Y(i,l) = A(i,j)*B(j,k)*X(k,l)", formats={"A": "csr", "B": "csr"}, target="c")
    assert "precomputed into workspace w(j, l)" in k.cin, k.cin
    ops = {"A": _tensor(A, "csr"), "B": _tensor(B, "csr"), "X": _tensor(X, "UU")}
    n, m = A.shape
    extents = {"i": n, "j": m, "k": n, "l": cols}
    out = run_under_asan(asan_cc, tmp_path, k, "UU", (n, cols), extents, ops)
    np.testing.assert_array_equal(out.to_numpy(), A @ (B @ X))
