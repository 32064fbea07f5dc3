"""Dense outputs that kernels zero themselves (ucf.lower.zeroing), against numpy and scipy.

Every kernel here is also called into an ``out=`` full of NaN: an element that neither
the kernel nor the call clears stays NaN, and one cleared twice, or after its sum, is
wrong. The plan says which of the two clears (``Plan.writes_all``); both must give
the reference.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf

RNG = np.random.default_rng(20261126)


def _sparse(rows: int, cols: int, density: float, seed: int, empty_rows: bool = False):
    a = sp.random(rows, cols, density=density, format="csr", random_state=seed)
    if empty_rows:
        a = sp.csr_matrix(a.multiply((np.arange(rows) % 3 != 0)[:, None]))
    return a.toarray()


A = _sparse(67, 45, 0.15, 1, empty_rows=True)
B = RNG.standard_normal((45, 32))
X = RNG.standard_normal(45)
T = RNG.standard_normal((6, 7, 45)) * (RNG.random((6, 7, 45)) < 0.2)

SPMM = "C(i,k) = A(i,j) * B(j,k)"
TILE = "bound(k, kb, 32, MaxExact); split(kb, kt, kr, 16); reorder(i, kt, j, kr)"
ROWS = "split(i, i0, i1, 16); parallelize(i0, CPUThread, NoRaces)"

# (statement, formats, schedule, operands, reference, the kernel zeroes the output)
CASES = {
    "spmv csr": ("y(i) = A(i,j) * x(j)", {"A": "csr"}, None, {"A": A, "x": X}, A @ X, True),
    "spmv dcsr": ("y(i) = A(i,j) * x(j)", {"A": "dcsr"}, None, {"A": A, "x": X}, A @ X, False),
    "spmm csr": (SPMM, {"A": "csr"}, None, {"A": A, "B": B}, A @ B, True),
    "spmm csr tile": (SPMM, {"A": "csr"}, TILE, {"A": A, "B": B}, A @ B, True),
    "spmm csr rows": (SPMM, {"A": "csr"}, f"{TILE}; {ROWS}", {"A": A, "B": B}, A @ B, True),
    "spmm split of split": (
        SPMM,
        {"A": "csr"},
        "split(i, i0, i1, 16); split(i1, it, ir, 3); reorder(i0, it, ir, j, k)",
        {"A": A, "B": B},
        A @ B,
        False,  # the tail of i1 is guarded deeper down, not clipped: zeroed by the call
    ),
    "spmm divide": (SPMM, {"A": "csr"}, "divide(i, i0, i1, 4)", {"A": A, "B": B}, A @ B, True),
    "spmm dcsr": (SPMM, {"A": "dcsr"}, None, {"A": A, "B": B}, A @ B, False),
    "spmm bcsr": (SPMM, {"A": "bcsr(4,4)"}, None, {"A": A, "B": B}, A @ B, True),
    "spmm k outer": (SPMM, {"A": "csr"}, "reorder(k, i, j)", {"A": A, "B": B}, A @ B, True),
    "spmm j outer": (SPMM, {"A": "csc"}, None, {"A": A, "B": B}, A @ B, False),
    "add csr": (
        "C(i,j) = A(i,j) + D(i,j)",
        {"A": "csr", "D": "csr"},
        None,
        {"A": A, "D": A[::-1]},
        A + A[::-1],
        True,
    ),
    "ttv csf": (
        "Y(i,j) = T(i,j,k) * x(k)",
        {"T": "csf"},
        None,
        {"T": T, "x": X},
        np.einsum("ijk,k->ij", T, X),
        False,
    ),
    "ttv ucc": (
        "Y(i,j) = T(i,j,k) * x(k)",
        {"T": "UUC"},
        None,
        {"T": T, "x": X},
        np.einsum("ijk,k->ij", T, X),
        True,
    ),
}


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_into_nan_output_matches_reference(name, target):
    stmt, formats, schedule, operands, want, zeroes = CASES[name]
    k = ucf.compile(stmt, formats=formats, schedule=schedule, target=target)
    assert k._plan.writes_all is zeroes, k.cin
    assert ("the kernel zeroes each slice" in k.cin) is zeroes
    ops = {
        n: ucf.from_numpy(a, format=formats[n]) if n in formats else a for n, a in operands.items()
    }
    np.testing.assert_allclose(np.asarray(k(**ops)), want, rtol=1e-12, atol=1e-12)
    for _ in range(3):  # the later calls replay the bound arguments (ucf.exec.replay)
        out = np.full(want.shape, np.nan)
        k(**ops, out=out)
        np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(k(**ops)), want, rtol=1e-12, atol=1e-12)
