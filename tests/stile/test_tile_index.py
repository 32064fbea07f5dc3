"""STile (issue 16): permutation invariance, the unordered compressed level, and the
online index of nonzero micro-tiles, against numpy and scipy."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.asan import driver_under_asan
from ucf.stile.index_kernel import _function

MATMUL = "C(m,n) = A(m,k)*B(k,n)"
BATCH = "C(b,m,n) = A(b,m,k)*B(b,k,n)"
CONV = "O(n,m,x,y) = I(n,c,x+r,y+s)*W(m,c,r,s)"
TARGETS = ["llvm", "c"]
SHAPES = [(1, 1), (1, 8), (32, 1), (1, 64), (32, 64)]
DENSITIES = [1.0, 0.5, 0.1, 0.01, 0.0]


# ---------------------------------------------------------------- invariance
def test_matmul_variables_are_sporadic_and_condensable():
    assert ucf.invariance(MATMUL) == {"m": "sporadic", "n": "sporadic", "k": "sporadic"}
    for v in "mnk":
        ucf.condensable(MATMUL, [v])
    ucf.condensable(MATMUL, ["k"], per=["m"])  # a 32x1 mask: k condensed per block of m


def test_batch_matmul_mask_per_b_is_condensable():
    kinds = ucf.invariance(BATCH)
    assert kinds["b"] == "prevalent" and kinds["k"] == "sporadic"
    ucf.condensable(BATCH, ["k"], per=["b"])
    ucf.condensable(BATCH, ["m", "k"], per=["b"])


def test_convolution_window_variables_are_compound_and_refused():
    kinds = ucf.invariance(CONV)
    assert {v for v, k in kinds.items() if k == "compound"} == {"x", "y", "r", "s"}
    assert kinds["c"] == "sporadic"
    with pytest.raises(ucf.ScheduleError, match=r"x is a compound variable \(in I\("):
        ucf.condensable(CONV, ["x"])
    ucf.condensable(CONV, ["c"])


def test_permutation_cannot_vary_along_a_summed_variable():
    with pytest.raises(ucf.ScheduleError, match="l is sporadic and summed"):
        ucf.condensable("C(m) = A(m,k,l)*B(k,l)", ["k"], per=["l"])
    with pytest.raises(ucf.ScheduleError, match="z is not an index variable"):
        ucf.condensable(MATMUL, ["z"])


def test_condense_command_checks_then_points_a_static_operand_to_dynamic():
    with pytest.raises(ucf.ScheduleError, match="condense: x is a compound variable"):
        ucf.compile(CONV, schedule="condense(x, I, 8)")
    with pytest.raises(ucf.ScheduleError, match="B has no index variable m"):
        ucf.compile(MATMUL, schedule="condense(m, B, 8)")
    with pytest.raises(ucf.ScheduleError, match="Z is not an operand"):
        ucf.compile(MATMUL, schedule="condense(k, Z, 8)")
    with pytest.raises(
        ucf.UnsupportedError,
        match=r"k can be condensed, but only a dynamic operand's tiles are gathered: "
        r"compile with dynamic=\{'A': <micro-tile shape>\}",
    ):
        ucf.compile(MATMUL, {"A": "csr"}, schedule="condense(k, A, 64)")
    with pytest.raises(ucf.ScheduleError, match="depth must be a positive integer"):
        ucf.compile(MATMUL, schedule=ucf.Schedule().condense("k", "A", 0))


def test_cin_shows_the_classification():
    k = ucf.compile(BATCH)
    assert "permutation invariance: b prevalent, m sporadic, n sporadic, k sporadic" in k.cin


# ---------------------------------------------------------------- the Q level
def _shuffled(a: np.ndarray, seed: int) -> ucf.Tensor:
    """``a`` in UQ with every row's entries in a random order."""
    rng = np.random.default_rng(seed)
    m = sp.csr_array(a)
    crd, vals = m.indices.astype(np.int32), m.data.copy()
    for r in range(a.shape[0]):
        lo, hi = m.indptr[r], m.indptr[r + 1]
        p = lo + rng.permutation(hi - lo)
        crd[lo:hi], vals[lo:hi] = crd[p], vals[p]
    levels = [{}, {"pos": m.indptr.astype(np.int32), "crd": crd}]
    return ucf.Tensor(a.shape, "UQ", levels, vals)


def _sparse(shape, density, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return (rng.random(shape) * (rng.random(shape) < density)).astype(dtype)


def test_unordered_round_trips():
    a = _sparse((40, 30), 0.2, 1)
    t = ucf.from_numpy(a, "UQ")
    assert str(t.format) == "UQ" and not t.format.levels[1].ordered
    np.testing.assert_array_equal(t.to_numpy(), a)
    s = _shuffled(a, 2)
    assert np.any(np.diff(s.levels[1]["crd"]) < 0)  # really out of order
    np.testing.assert_array_equal(s.to_numpy(), a)
    np.testing.assert_array_equal(s.to_scipy().toarray(), a)
    np.testing.assert_array_equal(ucf.from_scipy(sp.csr_array(a), "UQ").to_numpy(), a)
    np.testing.assert_array_equal(s.convert("csr").to_numpy(), a)


def test_unordered_check_refuses_repeats_but_not_disorder():
    a = _sparse((6, 9), 0.6, 3)
    s = _shuffled(a, 4)
    lv = s.levels[1]
    crd = lv["crd"].copy()
    row = int(np.argmax(np.diff(lv["pos"]) >= 2))
    crd[lv["pos"][row] + 1] = crd[lv["pos"][row]]
    with pytest.raises(ucf.FormatError, match=rf"level 1 .* repeats in the segment of .* {row}"):
        ucf.Tensor(a.shape, "UQ", [{}, {"pos": lv["pos"], "crd": crd}], s.vals)
    bad = lv["crd"].copy()
    bad[0] = 9
    with pytest.raises(ucf.FormatError, match="out of range"):
        ucf.Tensor(a.shape, "UQ", [{}, {"pos": lv["pos"], "crd": bad}], s.vals)


@pytest.mark.parametrize(
    "expr, formats",
    [
        ("C(i,j) = A(i,j) + B(i,j)", {"A": "UQ", "B": "UQ"}),
        ("C(i,j) = A(i,j) * B(i,j)", {"A": "UQ", "B": "csr"}),
        ("C(i,j) = A(i,j) + B(i,j)", {"A": "UQ", "B": "dense"}),
    ],
)
def test_unordered_refuses_coiteration_naming_tensor_and_level(expr, formats):
    a = _sparse((8, 8), 0.3, 5)
    s = _shuffled(a, 6)
    ops = {"A": s, "B": s if formats["B"] == "UQ" else ucf.from_numpy(a, formats["B"])}
    with pytest.raises(ucf.UnsupportedError, match=r"tensor A, level 1 \(unordered compressed\)"):
        ucf.compile(expr, formats)(**ops)


def test_unordered_refuses_search():
    with pytest.raises(ucf.FormatError, match="no ordered coordinates to search"):
        ucf.format.levels.KINDS["Q"].search({}, None, None, None, None)


@pytest.mark.parametrize("target", TARGETS)
def test_unordered_spmv_spmm_against_numpy(target):
    rng = np.random.default_rng(7)
    a = _sparse((37, 29), 0.15, 8, np.float32)
    s = _shuffled(a, 9)
    x = rng.random(29).astype(np.float32)
    b = rng.random((29, 5)).astype(np.float32)
    spmv = ucf.compile("y(i) = A(i,j)*x(j)", {"A": "UQ"}, target=target)
    np.testing.assert_allclose(spmv(A=s, x=x), a @ x, rtol=1e-5)
    spmm = ucf.compile("C(i,n) = A(i,j)*B(j,n)", {"A": "UQ"}, target=target)
    np.testing.assert_allclose(spmm(A=s, B=b), a @ b, rtol=1e-5)
    yt = ucf.compile("y(j) = A(i,j)*x(i)", {"A": "UQ"}, target=target)
    z = rng.random(37).astype(np.float32)
    np.testing.assert_allclose(yt(A=s, x=z), a.T @ z, rtol=1e-5)


# ---------------------------------------------------------------- stile_index
def _tiles(mask: np.ndarray, bh: int, bw: int) -> set[tuple[int, int]]:
    """The live tiles of a sorted BCSR (scipy's BSR over the padded mask)."""
    m, k = mask.shape
    mb, kb = -(-m // bh), -(-k // bw)
    padded = np.zeros((mb * bh, kb * bw), dtype=np.float64)
    padded[:m, :k] = mask
    bsr = sp.bsr_array(padded, blocksize=(bh, bw))
    bsr.sort_indices()
    live = np.abs(bsr.data).reshape(len(bsr.indices), bh * bw).sum(axis=1) > 0
    rows = np.repeat(np.arange(mb), np.diff(bsr.indptr))
    return set(zip(rows[live].tolist(), bsr.indices[live].tolist(), strict=True))


def _listed(t: ucf.Tensor) -> set[tuple[int, int]]:
    pos, crd = t.levels[1]["pos"], t.levels[1]["crd"]
    rows = np.repeat(np.arange(t.shape[0]), np.diff(pos))
    listed = list(zip(rows.tolist(), crd.tolist(), strict=True))
    assert len(listed) == len(set(listed))
    return set(listed)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", SHAPES)
def test_stile_index_lists_the_tiles_of_a_sorted_bcsr(target, shape):
    rng = np.random.default_rng(11)
    for density in DENSITIES:
        mask = rng.random((97, 130)) < density
        t = ucf.stile_index(mask, shape, target=target)
        assert str(t.format) == "UQ"
        assert t.shape == (-(-97 // shape[0]), -(-130 // shape[1]))
        assert _listed(t) == _tiles(mask, *shape), (shape, density)


def test_stile_index_takes_any_numeric_mask():
    rng = np.random.default_rng(12)
    a = _sparse((40, 50), 0.1, 13, np.float32)
    for mask in (a, a.astype(np.float64), (a != 0).astype(np.int8), a != 0):
        assert _listed(ucf.stile_index(mask, (8, 2))) == _tiles(a != 0, 8, 2)
    assert _listed(ucf.stile_index(np.asfortranarray(a), (4, 4))) == _tiles(a != 0, 4, 4)
    for target in TARGETS:
        t = ucf.stile_index(a.astype(np.float16), (3, 7), target=target, index_dtype="int64")
        assert t.index_dtype == np.int64 and _listed(t) == _tiles(a != 0, 3, 7)
        nan = np.array([[np.nan, 0.0], [0.0, -0.0]])  # NaN != 0, as numpy and C say
        assert ucf.stile_index(nan, (1, 1), target=target).to_numpy().tolist() == [[1, 0], [0, 0]]
    for shape in ((0, 5), (5, 0), (0, 0)):
        t = ucf.stile_index(np.ones(shape, bool), (8, 8))
        assert t.to_numpy().size == 0 or not t.to_numpy().any()
    assert ucf.stile_index(np.ones((3, 4)), (8, 8)).to_numpy().tolist() == [[1.0]]
    with pytest.raises(ucf.OperandError, match="granularity"):
        ucf.stile_index(a, (0, 1))
    with pytest.raises(ucf.OperandError, match="one tile extent per mode"):
        ucf.stile_index(rng.random(5), (1, 1))
    with pytest.raises(ucf.OperandError, match="at least one mode"):
        ucf.stile_index(np.float32(1), ())
    with pytest.raises(ucf.UnsupportedError, match="llvm, c, cuda"):
        ucf.stile_index(a, (1, 1), target="tpu")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "shape, granularity",
    [((3, 37, 20), (1, 8, 3)), ((5, 9, 4, 7), (2, 4, 1, 2)), ((41,), (4,)), ((2, 3, 0), (1, 1, 2))],
)
def test_stile_index_of_more_modes_matches_numpy(target, shape, granularity):
    """Each leading tile is a dense level, the last one unordered; the live tiles are
    those numpy finds by padding the mask and reducing every tile."""
    rng = np.random.default_rng(15)
    for density in (0.0, 0.02, 0.3, 1.0):
        mask = rng.random(shape) < density
        t = ucf.stile_index(mask, granularity, target=target)
        grid = tuple(-(-n // g) for n, g in zip(shape, granularity, strict=True))
        assert str(t.format) == "U" * (len(shape) - 1) + "Q" and t.shape == grid
        padded = np.zeros([n * g for n, g in zip(grid, granularity, strict=True)], bool)
        padded[tuple(slice(0, n) for n in shape)] = mask
        split = [x for n, g in zip(grid, granularity, strict=True) for x in (n, g)]
        live = padded.reshape(split).any(axis=tuple(range(1, 2 * len(shape), 2)))
        pos, crd = t.levels[-1]["pos"], t.levels[-1]["crd"]
        for row in range(len(pos) - 1):
            seg = crd[pos[row] : pos[row + 1]].tolist()
            assert len(seg) == len(set(seg))
            expect = np.flatnonzero(live.reshape(len(pos) - 1, grid[-1])[row]).tolist()
            assert sorted(seg) == expect, (density, row)


@pytest.mark.parametrize("target", TARGETS)
def test_spmm_over_the_tiles_reads_the_dense_data_in_place(target):
    rng = np.random.default_rng(14)
    m, k, n, bh, bw = 64, 48, 8, 32, 1
    for density in (0.5, 0.05, 0.0):
        mask = rng.random((m, k)) < density
        a = (rng.random((m, k)) * mask).astype(np.float32)
        b = rng.random((k, n)).astype(np.float32)
        t = ucf.stile_index(mask, (bh, bw), target=target)
        spmm = ucf.compile("C(i,a,n) = T(i,k) * A(i,a,k,b) * B(k,b,n)", {"T": "UQ"}, target=target)
        a4 = a.reshape(m // bh, bh, k // bw, bw)
        assert np.shares_memory(ucf.from_numpy(a4).vals, a)
        c = spmm(T=t, A=a4, B=b.reshape(k // bw, bw, n))
        np.testing.assert_allclose(np.asarray(c).reshape(m, n), a @ b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "shape, granularity", [((70, 45), (32, 8)), ((3, 37, 20), (2, 8, 3)), ((45,), (8,))]
)
def test_index_kernel_is_asan_clean_on_empty_and_full_masks(tmp_path, shape, granularity):
    grid = [-(-n // g) for n, g in zip(shape, granularity, strict=True)]
    size, rows, kb = int(np.prod(shape)), int(np.prod(grid[:-1])), grid[-1]
    fn = _function("u8", "i32", granularity)
    dims = ", ".join(map(str, shape))
    driver = f"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {{
  for (int full = 0; full < 2; full++) {{
    uint8_t *mask = malloc({size});
    memset(mask, full, {size});
    int32_t *flags = calloc({rows * kb}, 4), *pos = calloc({rows + 1}, 4);
    int32_t *crd = malloc({rows * kb} * 4);
    {fn.name}(mask, {dims}, flags, pos, crd);
    long sum = 0;
    for (int q = 0; q < pos[{rows}]; q++) sum += crd[q];
    printf("%d %ld\\n", pos[{rows}], sum);
    free(mask); free(flags); free(pos); free(crd);
  }}
  return 0;
}}
"""
    lines = driver_under_asan(tmp_path, [fn], driver)
    full = f"{rows * kb} {rows * sum(range(kb))}"
    assert lines == ["0 0", full]


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_the_exported_check_refuses_repeated_coordinates_in_an_unordered_level(tmp_path):
    """``NAME_check`` of a saved kernel over ``UQ``: coordinates in any order pass, a
    coordinate repeated within a segment is UCF_ERR_CRD_DUPLICATE (it was accepted)."""
    import ctypes

    k = ucf.compile("y(i) = A(i,j)*x(j)", formats={"A": "UQ"}, target="c")
    (lib,) = [p for p in k.save(tmp_path / "uq", lib="shared") if p.suffix == ".so"]
    check = ctypes.CDLL(str(lib)).uq_check
    check.restype = ctypes.c_int
    pos = np.array([0, 3, 5], dtype=np.int32)
    vals, x = np.ones(5), np.ones(6)
    msg = ctypes.create_string_buffer(200)

    def run(crd):
        crd = np.asarray(crd, dtype=np.int32)
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        args = [i64(2), i64(6), i64(2), i64(6), ptr(pos.ctypes.data), ptr(crd.ctypes.data)]
        args += [ptr(vals.ctypes.data), i64(6), ptr(x.ctypes.data)]
        return check(*args, msg, len(msg))

    assert run([4, 0, 2, 5, 1]) == 0, msg.value
    assert run([4, 0, 4, 5, 1]) != 0 and b"coordinate 4 repeats" in msg.value
    assert run([4, 0, 2, 5, 5]) != 0 and b"segment of parent 1" in msg.value
