"""Row groups (ucf.passes.row_groups): fixed-width operands' kernels run rows in lock
step, against numpy, on shapes that leave partial groups of rows, partial tiles of
columns and partial N:M groups, with empty rows, in float32 and float64, on both CPU
targets (which must agree bit for bit: each element sums its terms in one order)."""

from __future__ import annotations

import numpy as np
import pytest

import ucf

SPMM = "C(i,j) = A(i,k) * B(k,j)"
SPMV = "y(i) = A(i,k) * x(k)"


def _n_of_m(rng, rows: int, cols: int, n: int, m: int, dtype) -> np.ndarray:
    """At most n nonzeros in every group of m columns (the last group may be partial),
    with rows 1 and 4 empty."""
    a = np.zeros((rows, cols))
    for i in range(rows):
        for g in range(0, cols, m):
            width = min(m, cols - g)
            keep = rng.choice(width, size=min(n, width), replace=False)
            a[i, g + keep] = rng.standard_normal(len(keep))
    a[[1, 4] if rows > 4 else [0]] = 0
    return a.astype(dtype)


def _equal_rows(rng, rows: int, cols: int, w: int, dtype) -> np.ndarray:
    """w nonzeros in each row (one row empty: padding only)."""
    a = np.zeros((rows, cols))
    for i in range(rows):
        a[i, rng.choice(cols, size=w, replace=False)] = rng.standard_normal(w)
    a[rows // 2] = 0
    return a.astype(dtype)


def _run(stmt: str, fmt: str, dtype: str, a: np.ndarray, other: np.ndarray, schedule=None):
    """The result on each CPU target, and the kernels' notes."""
    ucf.set_num_threads(2)
    name = "B" if "B" in stmt else "x"
    got, notes = {}, ""
    for target in ("llvm", "c"):
        k = ucf.compile(stmt, formats={"A": fmt}, dtype=dtype, target=target, schedule=schedule)
        got[target] = k(A=ucf.from_numpy(a, format=fmt), **{name: other}).to_numpy()
        notes += k.cin
    return got, notes


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    ("fmt", "rows", "cols", "cols_b"),
    [
        ("nm(2,4)", 7, 10, 37),  # 2 groups of 3 rows + 1, a partial N:M group, 1 tile + 5
        ("nm(2,4)", 3, 8, 64),  # one group of rows, whole tiles only
        ("nm(1,4)", 11, 16, 20),  # no whole tile (f32: 32 columns a tile)
        ("ell(3)", 8, 9, 70),  # a loop over slots of constant trip count
        ("ell(6)", 5, 12, 33),  # more slots than are unrolled
    ],
)
def test_spmm_tiles(fmt, rows, cols, cols_b, dtype):
    rng = np.random.default_rng(rows * cols)
    if fmt.startswith("nm"):
        n, m = (int(v) for v in fmt[3:-1].split(","))
        a = _n_of_m(rng, rows, cols, n, m, dtype)
    else:
        a = _equal_rows(rng, rows, cols, int(fmt[4:-1]), dtype)
    b = rng.standard_normal((cols, cols_b)).astype(dtype)
    got, notes = _run(SPMM, fmt, dtype, a, b)
    assert "row groups: C is accumulated in tiles" in notes
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got["llvm"], a @ b, rtol=tol, atol=tol)
    np.testing.assert_array_equal(got["llvm"], got["c"])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    ("fmt", "rows", "cols"),
    [("ell(3)", 10, 7), ("ell(16)", 9, 40), ("nm(2,4)", 6, 14), ("ell(1)", 3, 2)],
)
def test_spmv_chains(fmt, rows, cols, dtype):
    rng = np.random.default_rng(rows + cols)
    if fmt.startswith("nm"):
        a = _n_of_m(rng, rows, cols, 2, 4, dtype)
    else:
        a = _equal_rows(rng, rows, cols, int(fmt[4:-1]), dtype)
    x = rng.standard_normal(cols).astype(dtype)
    got, notes = _run(SPMV, fmt, dtype, a, x)
    assert "rows (i) sum their entries side by side" in notes
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got["llvm"], a @ x, rtol=tol, atol=tol)
    np.testing.assert_array_equal(got["llvm"], got["c"])


def test_off_with_register_blocking(monkeypatch):
    """``UCF_REGISTER_BLOCKING=0`` turns the row groups off too (the plain kernel, for
    measuring what they gain)."""
    monkeypatch.setenv("UCF_REGISTER_BLOCKING", "0")
    k = ucf.compile(SPMV, formats={"A": "ell(2)"}, dtype="float32")
    a = _equal_rows(np.random.default_rng(0), 6, 5, 2, "float32")
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_allclose(k(A=ucf.from_numpy(a, format="ell(2)"), x=x).to_numpy(), a @ x)
    assert "row groups" not in k.cin


@pytest.mark.parametrize("fmt", ["ell(2)", "nm(2,4)"])
def test_sddmm(fmt):
    """An SDDMM-like statement (its default loop order walks A's slots innermost, into
    C at A's coordinates: neither shape of row group, so the kernel is left as it is)."""
    rng = np.random.default_rng(3)
    a = (
        _equal_rows(rng, 7, 8, 2, "float64")
        if fmt.startswith("ell")
        else _n_of_m(rng, 7, 8, 2, 4, "float64")
    )
    b, d = rng.standard_normal((7, 5)), rng.standard_normal((5, 8))
    ucf.set_num_threads(2)
    got = {}
    for target in ("llvm", "c"):
        k = ucf.compile(
            "C(i,j) = A(i,j) * B(i,k) * D(k,j)", formats={"A": fmt}, dtype="float64", target=target
        )
        got[target] = k(A=ucf.from_numpy(a, format=fmt), B=b, D=d).to_numpy()
    np.testing.assert_allclose(got["llvm"], a * (b @ d), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got["llvm"], got["c"])


@pytest.mark.parametrize("stmt", [SPMM, SPMV])
def test_threads(stmt, monkeypatch):
    """Every parallel loop starts its threads (``UCF_WORK_THRESHOLD=0``): B's panels
    are filled and the tiles run on two threads at once."""
    monkeypatch.setenv("UCF_WORK_THRESHOLD", "0")
    rng = np.random.default_rng(7)
    a = _n_of_m(rng, 50, 24, 2, 4, "float32")
    other = rng.standard_normal((24, 70) if stmt == SPMM else 24).astype(np.float32)
    got, notes = _run(stmt, "nm(2,4)", "float32", a, other)
    assert "row groups" in notes
    np.testing.assert_allclose(got["llvm"], a @ other, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got["llvm"], got["c"])


@pytest.mark.parametrize(
    ("stmt", "fmt", "shape"),
    [(SPMM, "nm(2,4)", (131, 64, 70)), (SPMV, "ell(16)", (20011, 40, None))],
)
def test_one_thread_keeps_the_groups(stmt, fmt, shape):
    """The plan for one thread (a call large enough for a plan of its own) runs its
    serial row loop in groups as the parallel plan does, since its rows are independent
    all the same (``ucf.lower.parallel.mark_independent``): it lost the tiles before and
    ran N:M SpMM 5x slower than on two threads. Same bits as the two-thread plan's."""
    rows, cols, cols_b = shape
    rng = np.random.default_rng(11)
    if fmt.startswith("nm"):
        a = _n_of_m(rng, rows, cols, 2, 4, "float32")
    else:
        a = _equal_rows(rng, rows, cols, 16, "float32")
    other = rng.standard_normal((cols, cols_b) if cols_b else cols).astype(np.float32)
    name = "B" if stmt == SPMM else "x"
    got = {}
    for threads in (1, 2):
        ucf.set_num_threads(threads)
        for target in ("llvm", "c"):
            k = ucf.compile(stmt, formats={"A": fmt}, dtype="float32", target=target)
            at = ucf.from_numpy(a, format=fmt)
            got[threads, target] = k(A=at, **{name: other}).to_numpy()
            if threads == 1:
                assert "serial, since one thread is available" in k.cin
                assert "row groups" in k.cin
    np.testing.assert_allclose(got[1, "llvm"], a @ other, rtol=1e-4, atol=1e-4)
    for key in got:
        np.testing.assert_array_equal(got[key], got[1, "llvm"])


def test_int8_tiles_exact():
    """int8 N:M weights times uint8 activations into int32: the tiles (and B's uint8
    panels) are exact against numpy's integer product, on both targets."""
    rng = np.random.default_rng(11)
    keep = _n_of_m(rng, 8, 16, 2, 4, "float64") != 0
    a = np.where(keep, rng.integers(-127, 128, keep.shape), 0).astype(np.int8)
    b = rng.integers(0, 256, (16, 40)).astype(np.uint8)
    ucf.set_num_threads(2)
    want = a.astype(np.int64) @ b.astype(np.int64)
    for target in ("llvm", "c"):
        k = ucf.compile(
            SPMM,
            formats={"A": "nm(2,4)@int8", "B": "dense@uint8"},
            dtype="int32",
            target=target,
        )
        got = k(A=ucf.from_numpy(a, format="nm(2,4)@int8"), B=b).to_numpy()
        assert "row groups: C is accumulated in tiles" in k.cin
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("cols_b", "shape"), [(16, (6, 2)), (8, (12, 1)), (24, (4, 3))])
def test_narrow_constant_rows_take_narrow_tiles(cols_b, shape, dtype):
    """``bound`` gives j a constant trip count narrower than a tile of 4 vectors: the
    tile takes the vectors it fills and more rows (float32 by 16 columns: 6 rows x 2
    vectors), where its rows ran in the original nest before. The rows left over
    (29 = 2 x 12 + 5) and, in float64, the columns past the tile run as before."""
    rng = np.random.default_rng(cols_b)
    a = _n_of_m(rng, 29, 40, 2, 4, dtype)
    b = rng.standard_normal((40, cols_b)).astype(dtype)
    got, notes = _run(SPMM, "nm(2,4)", dtype, a, b, f"bound(j, jb, {cols_b}, MaxExact)")
    lanes = 8 if dtype == "float32" else 4
    rows, vectors = (
        shape
        if dtype == "float32"
        else ((3, 4) if cols_b >= 16 else (12 // (cols_b // lanes), cols_b // lanes))
    )
    assert f"tiles of {rows} rows (i) x {vectors} vectors" in notes, notes
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got["llvm"], a @ b, rtol=tol, atol=tol)
    np.testing.assert_array_equal(got["llvm"], got["c"])


@pytest.mark.parametrize(
    ("dtype", "left"),
    [("float32", left) for left in (1, 13, 31)] + [("float64", left) for left in (2, 10, 15)],
)
def test_columns_after_the_tiles_take_narrower_tiles(dtype, left):
    """A constant j ``left`` columns past its last whole tile (4 vectors): those columns
    take narrower tiles, whole vectors then halves, quarters... down to scalars, each
    over the rows the tile before grouped (29 rows: 27 in the first tiles, fewer in the
    later ones, the rest in the original loop). Between them the widths take narrower
    tiles of 1, 2 and 3 vectors, and of 4, 2 and 1 lanes."""
    lanes = 8 if dtype == "float32" else 4
    cols_b = 4 * lanes + left
    rng = np.random.default_rng(left)
    a = _n_of_m(rng, 29, 40, 2, 4, dtype)
    b = rng.standard_normal((40, cols_b)).astype(dtype)
    got, notes = _run(SPMM, "nm(2,4)", dtype, a, b, f"bound(j, jb, {cols_b}, MaxExact)")
    assert f"the {left} columns after the whole tiles in narrower tiles" in notes, notes
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got["llvm"], a @ b, rtol=tol, atol=tol)
    np.testing.assert_array_equal(got["llvm"], got["c"])
