"""A producer that walks its operand as stored in loops of its own and scatters into a
workspace (``ucf.schedule.own_order``) under AddressSanitizer (``tests/toolchain/test_asan.py``
says how), on square operands padded from rectangular and empty ones."""

from __future__ import annotations

import numpy as np
import pytest

import ucf
from tests.asan import run_under_asan
from tests.toolchain.test_asan import MATS, _tensor


@pytest.mark.parametrize("case", list(MATS))
def test_a_producer_scattering_a_transposed_read(asan_cc, tmp_path, case):
    """``A@x + A.T@x`` by default: the second term's producer walks A's rows and scatters
    into a workspace over the whole range of i."""
    A = MATS[case]
    n = max(A.shape)
    A = np.pad(A, ((0, n - A.shape[0]), (0, n - A.shape[1])))  # square, last rows empty
    x = np.arange(1, n + 1, dtype=np.float64)
    k = ucf.compile("y(i) = A(i,j)*x(j) + A(j,i)*x(j)", formats={"A": "csr"}, target="c")
    assert "scattering into" in k.cin
    ops = {"A": _tensor(A, "csr"), "x": _tensor(x, "U")}
    out = run_under_asan(asan_cc, tmp_path, k, "U", (n,), {"i": n, "j": n}, ops)
    np.testing.assert_array_equal(out.to_numpy(), A @ x + A.T @ x)


@pytest.mark.parametrize("case", list(MATS))
def test_an_intersection_workspace_appended_in_one_pass(asan_cc, tmp_path, case):
    """``A.*B + M`` by default: A.*B gathered into a row workspace, the output appended
    in one pass into arrays bounded by the operands' entries (``ucf.schedule.intersections``),
    rows in chunks on two threads."""
    A = MATS[case]
    B, M = np.roll(A, 1, axis=1) + A, np.roll(A, 1, axis=0) * 3
    k = ucf.compile(
        "C(i,j) = A(i,j)*B(i,j) + M(i,j)",
        formats={"A": "csr", "B": "csr", "M": "csr", "C": "csr"},
        target="c",
    )
    assert "intersected" in k.cin and "one pass" in k.cin
    ops = {n: _tensor(v, "csr") for n, v in {"A": A, "B": B, "M": M}.items()}
    extents = {"i": A.shape[0], "j": A.shape[1]}
    out = run_under_asan(asan_cc, tmp_path, k, "csr", A.shape, extents, ops, threads=2)
    out.validate()
    np.testing.assert_array_equal(out.to_numpy(), A * B + M)
