"""Dynamic operands on CUDA (issue 16): the index built with atomicAdd slot claims and
the rewritten kernel, both run on the CPU emulator of generated CUDA, against numpy,
and against the same kernel on llvm; the generated source also compiles with nvcc."""

from __future__ import annotations

import numpy as np
import pytest

import ucf
from ucf.toolchain.cuda_build import nvcc_check, nvcc_path

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc")
MATMUL = "C(i,n) = A(i,k) * B(k,n)"
GRANULARITIES = [(1, 1), (1, 8), (32, 1), (1, 64), (32, 64)]


def _cuda(stmt: str, dynamic: dict, **kw) -> ucf.Kernel:
    return ucf.compile(stmt, dynamic=dynamic, target="cuda", emulate=True, **kw)


def _tile_mask(rng, shape: tuple[int, ...], tile: tuple[int, ...], density: float) -> np.ndarray:
    """A mask live in whole micro-tiles with ``density``, cut to ``shape``."""
    grid = [-(-n // t) for n, t in zip(shape, tile, strict=True)]
    live = rng.random(grid) < density
    for axis, t in enumerate(tile):
        live = np.repeat(live, t, axis=axis)
    return live[tuple(slice(0, n) for n in shape)]


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_matmul_against_numpy_with_masks_changing_between_calls(granularity):
    """One kernel, a new mask each call (0 % to 100 % live), extents the tiles do not
    divide (the padded path), float32 against numpy."""
    rng = np.random.default_rng(sum(granularity))
    M, K, N = 70, 130, 40
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    k = _cuda(MATMUL, {"A": granularity}, dtype=np.float32)
    for density in (0.0, 0.1, 0.5, 1.0):
        mask = _tile_mask(rng, (M, K), granularity, density)
        C = np.asarray(k(A=A, B=B, masks={"A": mask}))
        np.testing.assert_allclose(C, (A * mask) @ B, rtol=1e-4, atol=1e-4)


def test_cuda_agrees_with_llvm_and_the_mask_wins():
    """Differential: the same dynamic matmul on llvm and on emulated CUDA, float64;
    a nonzero of A outside the mask counts as zero on both."""
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((64, 96)), rng.standard_normal((96, 33))
    mask = _tile_mask(rng, A.shape, (32, 1), 0.3)
    on_cuda = _cuda(MATMUL, {"A": (32, 1)})(A=A, B=B, masks={"A": mask})
    on_llvm = ucf.compile(MATMUL, dynamic={"A": (32, 1)})(A=A, B=B, masks={"A": mask})
    np.testing.assert_allclose(np.asarray(on_cuda), np.asarray(on_llvm), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(on_cuda), (A * mask) @ B, rtol=1e-12, atol=1e-12)


def test_mask_from_zeros_and_batch_matmul_with_a_mask_per_b():
    rng = np.random.default_rng(4)
    A3, B3 = rng.random((3, 64, 20)), rng.random((3, 20, 5))
    mask3 = rng.random(A3.shape) < 0.2
    bmm = _cuda("C(b,i,n) = A(b,i,k) * B(b,k,n)", {"A": (1, 32, 1)})
    C3 = bmm(A=A3, B=B3, masks={"A": mask3})
    np.testing.assert_allclose(np.asarray(C3), np.einsum("bik,bkn->bin", A3 * mask3, B3))
    C3 = bmm(A=A3 * mask3, B=B3)  # no mask: A's nonzeros
    np.testing.assert_allclose(np.asarray(C3), np.einsum("bik,bkn->bin", A3 * mask3, B3))


def test_moe_with_empty_experts_and_all_tokens_on_one():
    rng = np.random.default_rng(5)
    E, T, D, N = 4, 50, 12, 9
    X, W = rng.random((T, D)), rng.random((E, D, N))
    moe = _cuda("C(e,t,n) = R(e,t) * X(t,d) * W(e,d,n)", {"R": (1, 1)})
    gates = rng.random((E, T))
    top1 = np.zeros((E, T))
    top1[rng.integers(0, 2, T), np.arange(T)] = 1.0  # experts 2 and 3 stay empty
    one = np.zeros((E, T))
    one[1] = gates[1]  # every token on expert 1
    for R in (top1 * gates, one, np.zeros((E, T))):
        C = moe(R=R, X=X, W=W)
        np.testing.assert_allclose(np.asarray(C), np.einsum("et,td,edn->etn", R, X, W))


def test_spmv_runs_with_the_cuda_default():
    """No column variable outside A: the CUDA default maps the rows to threads."""
    rng = np.random.default_rng(6)
    A, x = rng.random((90, 70)), rng.random(70)
    mask = rng.random(A.shape) < 0.1
    spmv = _cuda("y(i) = A(i,k) * x(k)", {"A": (1, 8)})
    assert "GPUThread" in spmv.cin
    np.testing.assert_allclose(np.asarray(spmv(A=A, x=x, masks={"A": mask})), (A * mask) @ x)


def test_cin_names_the_gpu_mapping_and_no_condensed_kernel():
    k = _cuda(MATMUL, {"A": (32, 1)}, dtype=np.float32)
    assert "loop i_blk runs in parallel (GPUBlock, NoRaces)" in k.cin
    assert "GPUThread" in k.cin and "condensed" not in k.cin
    assert "__global__" in k.source


def test_emulate_needs_cuda():
    with pytest.raises(ucf.UnsupportedError, match="emulate=True"):
        ucf.compile(MATMUL, dynamic={"A": (32, 1)}, emulate=True)


@needs_nvcc
def test_the_dynamic_kernel_compiles_with_nvcc():
    k = ucf.compile(MATMUL, dynamic={"A": (32, 1)}, target="cuda", dtype=np.float32)
    nvcc_check(k.source, "sm_80")


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_matmul_on_a_gpu(device, granularity):
    """The same kernel on a GPU: the index built there with atomicAdd slot claims."""
    rng = np.random.default_rng(sum(granularity))
    A, B = rng.standard_normal((70, 130)), rng.standard_normal((130, 40))
    k = ucf.compile(MATMUL, dynamic={"A": granularity}, target="cuda")
    for density in (0.0, 0.1, 1.0):
        mask = _tile_mask(rng, A.shape, granularity, density)
        C = np.asarray(k(A=A, B=B, masks={"A": mask}))
        np.testing.assert_allclose(C, (A * mask) @ B, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("tile", [(1, 1), (1, 2), (1, 3)])
def test_column_max_over_live_tiles_of_one_row(tile):
    """``X(j) = max(i, B(i,j))`` with B dynamic in tiles of one row: the max walks the
    live tiles and folds the absent entries' 0 in once where a column has any (issue
    34's idempotent reductions), on emulated CUDA as on llvm; masks empty, partial
    and full, all-negative values so the fill decides."""
    rng = np.random.default_rng(tile[1])
    k = _cuda("X(j) = max(i, B(i,j))", {"B": tile})
    for density in (0.0, 0.3, 0.7, 1.0):
        B = rng.standard_normal((7, 6 * tile[1])) - 1.0
        mask = _tile_mask(rng, B.shape, tile, density)
        want = np.where(mask, B, 0.0).max(axis=0)
        np.testing.assert_array_equal(np.asarray(k(B=B, masks={"B": mask})), want)
