"""STile's online index on CUDA (issue 16, item 3): atomicAdd slot claims, run on the
CPU emulator of generated CUDA and compiled with nvcc, against scipy's sorted BSR and
numpy. One build serves every tile shape (the extents are launch arguments), so
these tests build three emulated libraries: u8 masks of two and three modes, and a
float16 mask with an int64 index."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.asan import ASAN_FLAGS
from ucf.resources import runtime_dir
from ucf.stile import tile_index_cuda
from ucf.toolchain.cuda_build import EMULATION_FLAGS, nvcc_check, nvcc_path

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc")
SHAPES = [(1, 1), (1, 8), (32, 1), (1, 64), (32, 64)]
DENSITIES = [1.0, 0.5, 0.1, 0.01, 0.0]


def _cuda(mask, granularity, **kw) -> ucf.Tensor:
    return ucf.stile_index(mask, granularity, target="cuda", emulate=True, **kw)


def _bsr_tiles(mask: np.ndarray, bh: int, bw: int) -> set[tuple[int, int]]:
    """The live tiles of scipy's sorted BSR over the zero-padded mask."""
    m, k = mask.shape
    mb, kb = -(-m // bh), -(-k // bw)
    padded = np.zeros((mb * bh, kb * bw))
    padded[:m, :k] = mask
    bsr = sp.bsr_array(padded, blocksize=(bh, bw))
    bsr.sort_indices()
    live = bsr.data.reshape(len(bsr.indices), bh * bw).any(axis=1)
    rows = np.repeat(np.arange(mb), np.diff(bsr.indptr))
    return set(zip(rows[live].tolist(), bsr.indices[live].tolist(), strict=True))


def _live(mask: np.ndarray, granularity: tuple[int, ...]) -> np.ndarray:
    """numpy's tile grid: pad, reshape each mode into (tiles, extent), reduce with any."""
    grid = [-(-n // g) for n, g in zip(mask.shape, granularity, strict=True)]
    padded = np.zeros([n * g for n, g in zip(grid, granularity, strict=True)], bool)
    padded[tuple(slice(0, n) for n in mask.shape)] = mask
    split = [x for n, g in zip(grid, granularity, strict=True) for x in (n, g)]
    return padded.reshape(split).any(axis=tuple(range(1, 2 * mask.ndim, 2)))


def _segments(t: ucf.Tensor) -> list[list[int]]:
    """Each row's tile columns as listed, after checking they are unique and in range."""
    pos, crd = t.levels[-1]["pos"], t.levels[-1]["crd"]
    assert pos[0] == 0 and np.all(np.diff(pos) >= 0) and len(crd) == pos[-1]
    segs = [crd[pos[r] : pos[r + 1]].tolist() for r in range(len(pos) - 1)]
    for seg in segs:
        assert len(seg) == len(set(seg)) and all(0 <= c < t.shape[-1] for c in seg)
    return segs


@pytest.mark.parametrize("shape", SHAPES)
def test_emulated_cuda_index_lists_the_tiles_of_a_sorted_bsr(shape):
    rng = np.random.default_rng(21)
    for density in DENSITIES:
        mask = rng.random((97, 130)) < density  # neither extent divides by the tiles
        t = _cuda(mask, shape)
        assert str(t.format) == "UQ" and t.index_dtype == np.int32
        assert t.shape == (-(-97 // shape[0]), -(-130 // shape[1]))
        listed = {(r, c) for r, seg in enumerate(_segments(t)) for c in seg}
        assert listed == _bsr_tiles(mask, *shape), (shape, density)
        assert t.nnz == len(listed) and np.all(t.vals == 1)


@pytest.mark.parametrize(
    "shape, granularity",
    [
        ((3, 37, 20), (1, 8, 3)),
        ((4, 64, 33), (1, 32, 1)),
        ((2, 3, 0), (1, 1, 2)),
        ((5, 131, 7), (1, 1, 2)),
    ],
)
def test_emulated_cuda_index_of_three_modes_matches_numpy(shape, granularity):
    """The last case has 655 rows of tiles: the block's prefix sum takes 3 rows a thread."""
    rng = np.random.default_rng(22)
    for density in (0.0, 0.02, 0.3, 1.0):
        mask = rng.random(shape) < density
        t = _cuda(mask, granularity)
        live = _live(mask, granularity)
        assert str(t.format) == "UUQ" and t.shape == live.shape
        rows = live.reshape(int(np.prod(live.shape[:-1])), live.shape[-1])
        for row, seg in enumerate(_segments(t)):
            assert sorted(seg) == np.flatnonzero(rows[row]).tolist(), (density, row)


def test_emulated_cuda_index_takes_half_masks_and_an_int64_index():
    rng = np.random.default_rng(23)
    a = (rng.random((40, 50)) * (rng.random((40, 50)) < 0.1)).astype(np.float16)
    t = _cuda(a, (3, 7), index_dtype="int64")
    assert t.index_dtype == np.int64 and t.levels[1]["pos"].dtype == np.int64
    assert np.array_equal(t.to_numpy() != 0, _live(a != 0, (3, 7)))
    assert np.array_equal(t.to_numpy(), ucf.stile_index(a, (3, 7)).to_numpy())


@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_the_cuda_index_drives_an_spmm_against_numpy(target):
    """A ucf kernel (on the CPU, or generated CUDA on the emulator) loops over the
    listed tiles in their order and reads the dense data in place."""
    rng = np.random.default_rng(24)
    m, k, n, bh, bw = 64, 48, 8, 32, 1
    stmt = "C(i,a,n) = T(i,k) * A(i,a,k,b) * B(k,b,n)"
    spmm = ucf.compile(stmt, {"T": "UQ"}, target=target, emulate=target == "cuda")
    for density in (0.5, 0.05, 0.0):
        mask = rng.random((m, k)) < density
        a = (rng.random((m, k)) * mask).astype(np.float32)
        b = rng.random((k, n)).astype(np.float32)
        t = _cuda(mask, (bh, bw))
        c = spmm(T=t, A=a.reshape(m // bh, bh, k // bw, bw), B=b.reshape(k // bw, bw, n))
        np.testing.assert_allclose(np.asarray(c).reshape(m, n), a @ b, rtol=1e-5, atol=1e-6)


def test_the_slot_claims_are_atomic_fetch_adds():
    """The generated text claims slots with the old value atomicAdd returns: no sort."""
    source = tile_index_cuda.cuda_source("u8", "i32", 2)
    assert "int32_t slot = ucf_atomic_add(&next[" in source
    assert "int32_t old = ucf_atomic_add(&flags[" in source
    assert "sort" not in source


@needs_nvcc
@pytest.mark.parametrize(
    "mask_type, idx, order",
    [
        ("u8", "i32", 2),
        pytest.param("f16", "i64", 3, marks=pytest.mark.slow),
        pytest.param("f32", "i32", 1, marks=pytest.mark.slow),
    ],
)
def test_the_cuda_index_compiles_with_nvcc(mask_type, idx, order):
    nvcc_check(tile_index_cuda.cuda_source(mask_type, idx, order), "sm_80")


def test_bad_input_gives_ucf_errors():
    a = np.ones((8, 8), bool)
    with pytest.raises(ucf.OperandError, match="one tile extent per mode"):
        _cuda(a, (1, 1, 1))
    with pytest.raises(ucf.OperandError, match="granularity"):
        _cuda(a, (0, 4))
    with pytest.raises(ucf.OperandError, match="dtype complex128"):
        _cuda(a.astype(np.complex128), (1, 1))
    with pytest.raises(ucf.OperandError, match="at least one mode"):
        _cuda(np.float32(1), ())
    with pytest.raises(ucf.UnsupportedError, match="needs target='cuda'"):
        ucf.stile_index(a, (1, 1), emulate=True)


def test_without_a_gpu_the_cuda_target_says_what_is_missing():
    try:
        import pycuda.autoinit  # noqa: F401
    except Exception:  # no pycuda, or no device: pycuda raises its own types
        pass
    else:
        pytest.skip("a CUDA device is present")
    with pytest.raises(ucf.UcfError, match="emulate=True"):
        ucf.stile_index(np.ones((8, 8), bool), (4, 4), target="cuda")


@pytest.mark.slow
def test_the_emulated_cuda_index_is_asan_clean_on_empty_and_full_masks(tmp_path):
    """The launchers of one, two and three modes, built with AddressSanitizer against
    the emulator, over arrays of exactly the sizes ``build`` allocates."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("needs g++")
    cases = [((70, 45), (32, 8)), ((3, 37, 20), (2, 8, 3)), ((45,), (8,)), ((0, 5), (4, 4))]
    calls, expect = [], []
    for shape, granularity in cases:
        grid = [-(-n // g) for n, g in zip(shape, granularity, strict=True)]
        size, rows, kb = int(np.prod(shape)), int(np.prod(grid[:-1])), grid[-1]
        args = ", ".join(map(str, (*shape, *granularity)))
        calls.append(
            f"run({size}, {rows}, {kb}, [](auto m, auto f, auto p, auto n, auto c) {{ return "
            f"ucf_stile_index_{len(shape)}d_launch(m, {args}, f, p, n, c); }});"
        )
        expect += ["0 0 0", f"0 {rows * kb} {rows * sum(range(kb))}"]
    driver = (
        """
#include <cstdio>
#include <cstdlib>
#include <cstring>
template <typename F>
void run(int64_t size, int64_t rows, int64_t kb, F launch) {
  for (int full = 0; full < 2; full++) {
    uint8_t* mask = (uint8_t*)malloc(size ? size : 1);
    memset(mask, full, size);
    int32_t* flags = (int32_t*)calloc(rows * kb ? rows * kb : 1, 4);
    int32_t* pos = (int32_t*)calloc(rows + 1, 4);
    int32_t* next = (int32_t*)malloc((rows ? rows : 1) * 4);
    int32_t* crd = (int32_t*)malloc((rows * kb ? rows * kb : 1) * 4);
    const int status = launch(mask, flags, pos, next, crd);
    long sum = 0;
    for (int q = 0; q < pos[rows]; q++) sum += crd[q];
    printf("%d %d %ld\\n", status, pos[rows], sum);
    free(mask); free(flags); free(pos); free(next); free(crd);
  }
}
int main() {
"""
        + "\n".join(calls)
        + "\n}\n"
    )
    src = tmp_path / "tile_index.cu"
    src.write_text(
        "\n".join(tile_index_cuda.cuda_source("u8", "i32", r) for r in (1, 2, 3)) + driver
    )
    exe = tmp_path / "stile"
    flags = [f for f in EMULATION_FLAGS if f not in ("-shared", "-fPIC", "-O2")]
    cmd = [cxx, *flags, *ASAN_FLAGS, f"-I{runtime_dir()}"]
    build = subprocess.run(
        [*cmd, "-x", "c++", str(src), "-o", str(exe)], capture_output=True, text=True
    )
    if build.returncode != 0:
        pytest.skip(f"g++ lacks AddressSanitizer support: {build.stderr.strip()[:200]}")
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:-1] == expect
