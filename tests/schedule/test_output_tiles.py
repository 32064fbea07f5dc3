"""The default's register tiles of a wide output row (issue 34: the headroom run's tuner
found SpMM with N = 128 at 0.50-0.65x the default's time, and MTTKRP at 0.36-0.73x, by
tiling the innermost output loop and moving each tile's outer loop above the
reductions). Results against scipy and numpy on llvm and c."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf

TARGETS = ["llvm", "c"]


def _csr(rng, shape, density, empty_rows=0):
    m = sp.random(*shape, density=density, format="lil", random_state=rng)
    for r in rng.choice(shape[0], empty_rows, replace=False):
        m[r, :] = 0
    return sp.csr_matrix(m)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "n,tile", [(48, 16), (64, 32), (128, 32), (32, None), (100, None), (8, None)]
)
def test_spmm_runs_a_wide_row_in_register_tiles(target, n, tile):
    rng = np.random.default_rng(n)
    A = _csr(rng, (400, 300), 0.05, empty_rows=5)  # work enough for a plan of its own
    B = rng.standard_normal((300, n))
    k = ucf.compile("C(i,k) = A(i,j)*B(j,k)", formats={"A": "csr"}, target=target)
    got = k(A=ucf.from_scipy(A, format="csr"), B=B).to_numpy()
    np.testing.assert_allclose(got, A @ B, rtol=1e-12, atol=1e-12)
    if tile is None:
        assert "register tiles" not in k.cin
    else:
        assert f"k runs in register tiles of {tile}" in k.cin, k.cin
        assert f"split(k_b, k_b_t, k_b_r, {tile}); reorder(i, k_b_t, j, k_b_r)" in (k.schedule_used)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("r", [32, 64])
def test_mttkrp_runs_its_row_in_register_tiles(target, r):
    """Under two reductions (k, l) the tiles hold 16."""
    rng = np.random.default_rng(5)
    dense = rng.standard_normal((40, 30, 30)) * (rng.random((40, 30, 30)) < 0.35)
    dense[3] = 0  # an empty slice
    C, D = rng.standard_normal((30, r)), rng.standard_normal((30, r))
    k = ucf.compile("A(i,j) = B(i,k,l) * C(k,j) * D(l,j)", formats={"B": "csf"}, target=target)
    got = k(B=ucf.from_numpy(dense, format="csf"), C=C, D=D).to_numpy()
    np.testing.assert_allclose(got, np.einsum("ikl,kj,lj->ij", dense, C, D), rtol=1e-12, atol=1e-12)
    assert "j runs in register tiles of 16" in k.cin, k.cin


def test_a_reduction_innermost_gets_no_tile():
    """SDDMM's innermost loop sums (a dot product): no output row to hold."""
    k = ucf.compile("A(i,j) = B(i,j) * C(i,k) * D(k,j)", formats={"B": "csr", "A": "csr"})
    rng = np.random.default_rng(2)
    Bm = _csr(rng, (300, 400), 0.05)
    C, D = rng.standard_normal((300, 128)), rng.standard_normal((128, 400))
    got = k(B=ucf.from_scipy(Bm, format="csr"), C=C, D=D).to_numpy()
    np.testing.assert_allclose(got, Bm.multiply(C @ D).toarray(), rtol=1e-12, atol=1e-12)
    assert "register tiles" not in k.cin


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("fmt", "cols", "tiled"), [("nm(2,4)", 256, False), ("ell(4)", 64, True)])
def test_long_fixed_width_rows_run_in_row_groups(target, fmt, cols, tiled):
    """A fixed-width operand with 64 or more entries a row takes no register tiles of
    the bounded row (one chain of multiply-adds per vector over the whole row: N:M SpMM
    by 32 to 256 columns ran 5-6x slower so); its rows run in groups instead. Short
    rows (ELL with 4) keep the tiles."""
    rng = np.random.default_rng(cols)
    a = rng.standard_normal((1200, cols)) * (rng.random((1200, cols)) < 0.5)
    if fmt.startswith("nm"):  # keep 2 of every 4
        g = a.reshape(1200, -1, 4)
        g[:, :, 2:] = 0
    else:
        a = np.zeros((1200, cols))
        for i in range(1200):
            a[i, rng.choice(cols, 4, replace=False)] = rng.standard_normal(4)
    B = rng.standard_normal((cols, 64))
    k = ucf.compile("C(i,k) = A(i,j)*B(j,k)", formats={"A": fmt}, target=target)
    got = k(A=ucf.from_numpy(a, format=fmt), B=B).to_numpy()
    np.testing.assert_allclose(got, a @ B, rtol=1e-12, atol=1e-12)
    assert "bound(k)" in k.cin, k.cin
    assert ("register tiles of" in k.cin) is tiled, k.cin
    assert ("row groups" in k.cin) is not tiled, k.cin
