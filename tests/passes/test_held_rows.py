"""An output row held in registers across the loop that adds into it
(``ucf.passes.held_rows``): the gradients of an SDDMM (C's row of K co-iterated over
grad_A's and B's rows) against torch autograd in float64, on llvm and c (bit for bit the
same), one and two threads, each layout of D; SpMM adding into a given output, whose row
is loaded only where the loop runs; ASan on both; rows the pass leaves alone."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.asan import run_under_asan
from tests.autodiff.test_sddmm_gradient_layouts import (
    GRAD_C,
    LAYOUTS,
    SDDMM,
    operands,
    torch_reference,
)
from ucf.passes.tiling import WIDE_BYTES, tile_bytes
from ucf.schedule import cpu_model

pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's sparse-beta notes

HELD = "is held in"


@pytest.fixture
def own_plans(monkeypatch):
    """Every call plans for its own statistics (so ``bound(k)`` to K), as a call of 100k
    rows does."""
    monkeypatch.setattr(cpu_model, "REPLAN_WORK", 0)


def _gradients(target, layout, K, seed):
    fortran, fmt = LAYOUTS[layout]
    B, C, D, G = operands(n=13, m=11, K=K, seed=seed, fortran=fortran)
    Bs = ucf.from_numpy(B, format="csr")
    k = ucf.compile(SDDMM, {"A": "csr", "B": "csr", "D": fmt}, target=target)
    ops = {"B": Bs, "C": C, "D": D}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)
        A = k(**ops)
        cols, count = A.columns()
        at = tuple(A.format.mode_coords(cols, count).T)
        grad = ucf.Tensor(A.shape, A.format, A.levels, G[at])
        back = ucf.gradients(k)
        got = [back(w, grad, ops).to_numpy() for w in "BCD"]
    return got, back.kernel("C"), torch_reference(B, C, D, np.where(B != 0, G, 0))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("K", [2, 3, 8, 16, 64])
def test_sddmm_gradients_hold_cs_row(own_plans, threads, layout, K):
    """K = 3 holds scalars, 2 to 16 vectors (scalars where D is read strided); K = 64
    takes the bound alone when its register tile's reorder is refused (``j``
    co-iterates), and holds the row where half the vector registers take it (AVX-512: 8
    of 32)."""
    ucf.set_num_threads(threads)
    results = {}
    for target in ("llvm", "c"):
        got, kernel, want = _gradients(target, layout, K, seed=K)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
        # D declared UU is read down its columns at this size (not copied to UU:1,0):
        # scalars, and 64 of them are too many
        held = K < 64 or (tile_bytes("f64") == WIDE_BYTES and layout == "column-major")
        assert (HELD in kernel.cin) is held, kernel.cin
        assert f"bound(k, k_b, {K}, MaxExact)" in kernel.schedule_used, kernel.schedule_used
        results[target] = got[1]
    np.testing.assert_array_equal(results["llvm"], results["c"])


def _spmm_operands(n=37, m=29, K=8, seed=0):
    rng = np.random.default_rng(seed)
    A = sp.random(n, m, density=0.15, format="lil", random_state=rng)
    A[[0, 5, n - 1], :] = 0  # empty rows, the first and last among them
    return sp.csr_matrix(A), rng.standard_normal((m, K)), rng.standard_normal((n, K))


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("K", [1, 4, 8, 12])
def test_a_row_added_into_is_loaded_where_the_loop_runs(target, K):
    """``C(i,k) += A(i,j) * B(j,k)``: no zeroing to start from, so the row is loaded
    (under the loop's own entry test) and stored back; empty rows keep C's values."""
    A, B, C0 = _spmm_operands(K=K, seed=K)
    k = ucf.compile(
        "C(i,k) += A(i,j) * B(j,k)",
        {"A": "csr"},
        target=target,
        schedule=f"bound(k,kb,{K},MaxExact)",
    )
    C = C0.copy()
    k(A=ucf.from_scipy(A), B=B, out=C)
    np.testing.assert_allclose(C, C0 + A @ B, rtol=1e-12, atol=1e-12)
    assert HELD in k.cin, k.cin


def test_a_row_longer_than_half_the_registers_is_left_alone():
    """SpMM by 33 vectors' worth of columns: the row stays in memory, the result right."""
    K = 33 * tile_bytes("f64") // 8
    A, B, _ = _spmm_operands(K=K, seed=1)
    k = ucf.compile("C(i,k) = A(i,j) * B(j,k)", {"A": "csr"}, schedule=f"bound(k,kb,{K},MaxExact)")
    np.testing.assert_allclose(k(A=ucf.from_scipy(A), B=B).to_numpy(), A @ B, rtol=1e-12)
    assert HELD not in k.cin, k.cin


def test_a_dot_product_innermost_holds_nothing():
    """SDDMM's forward kernel sums over its innermost loop: no output row to hold."""
    B, C, D, _ = operands(n=30, m=20, K=8, seed=3)
    k = ucf.compile(SDDMM, {"A": "csr", "B": "csr"}, schedule="bound(k,kb,8,MaxExact)")
    got = k(B=ucf.from_numpy(B, format="csr"), C=C, D=np.ascontiguousarray(D)).to_numpy()
    np.testing.assert_allclose(got, B * (C @ D), rtol=1e-12, atol=1e-12)
    assert HELD not in k.cin


@pytest.mark.parametrize("K", [3, 8])
def test_grad_c_under_asan(asan_cc, tmp_path, monkeypatch, K):
    """C's gradient kernel, its row held from the zeroing, with exactly-sized buffers (an
    empty last row among them) and an output the driver fills with garbage."""
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path / "cache"))
    B, _, D, G = operands(n=13, m=11, K=K, seed=7)
    fmts = {"grad_A": "csr", "B": "csr", "D": "UU:1,0"}
    k = ucf.compile(GRAD_C, fmts, target="c", schedule=f"bound(k,kb,{K},MaxExact)")
    assert HELD in k.cin, k.cin
    ops = {
        "grad_A": ucf.from_numpy(np.where(B != 0, G, 0), format="csr"),
        "B": ucf.from_numpy(B, format="csr"),
        "D": ucf.from_numpy(D, format="UU:1,0"),
    }
    n, m = B.shape
    out = run_under_asan(asan_cc, tmp_path, k, "UU", (n, K), {"i": n, "j": m, "k": K}, ops)
    want = (np.where(B != 0, G, 0) * B) @ D.T
    np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-12, atol=1e-12)


def test_spmm_adding_under_asan(asan_cc, tmp_path, monkeypatch):
    """The row loaded before the loop and stored after it, in bounds on exactly-sized
    buffers with the first and last rows of C empty (0 and 36). The guard that skips an
    empty row's load and store is not what keeps this in bounds (C's row exists either
    way); it keeps the kernel from writing a row the nest never wrote."""
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path / "cache"))
    A, B, _ = _spmm_operands(K=8, seed=2)
    k = ucf.compile(
        "C(i,k) += A(i,j) * B(j,k)", {"A": "csr"}, target="c", schedule="bound(k,kb,8,MaxExact)"
    )
    assert HELD in k.cin, k.cin
    ops = {"A": ucf.from_scipy(A), "B": ucf.from_numpy(B)}
    (n, m), K = A.shape, 8
    out = run_under_asan(asan_cc, tmp_path, k, "UU", (n, K), {"i": n, "j": m, "k": K}, ops)
    np.testing.assert_allclose(out.to_numpy(), A @ B, rtol=1e-12, atol=1e-12)
