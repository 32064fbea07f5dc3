"""Saved C kernels run under AddressSanitizer with exactly-sized buffers.

Each test saves a kernel with ``Kernel.save``, writes a C driver that copies
the operands into heap buffers of exactly the size the storage needs (so
any out-of-bounds read or write trips ASan), calls ``kernel_assemble`` and
``kernel`` following the ABI in the saved header, and prints the output
arrays, which are compared with numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.asan import run_under_asan
from tests.helpers import arrival_operands, covered, rand_sparse


def _tensor(a, fmt, idt=np.int32, dtype=np.float64):
    return ucf.from_numpy(a, format=fmt, index_dtype=idt, dtype=dtype)


def _matrix_cases():
    rng = np.random.default_rng(7)
    a = rand_sparse(rng, (7, 9), 0.3, empty_rows=3)
    empty_rows = np.zeros((6, 5))
    empty_rows[4, 2] = 3.0
    return {
        "random": a,
        "nnz0": np.zeros((4, 5)),
        "empty_rows": empty_rows,
        "one": np.array([[2.5]]),
    }


MATS = _matrix_cases()


@pytest.mark.parametrize("case", list(MATS))
@pytest.mark.parametrize("idt", [np.int32, np.int64])
def test_spmv_csr(asan_cc, tmp_path, case, idt):
    A = MATS[case]
    x = np.arange(1, A.shape[1] + 1, dtype=np.float64)
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, target="c", index_dtype=idt)
    ops = {"A": _tensor(A, "csr", idt), "x": _tensor(x, "U", idt)}
    out = run_under_asan(
        asan_cc, tmp_path, k, "U", (A.shape[0],), {"i": A.shape[0], "j": A.shape[1]}, ops
    )
    np.testing.assert_array_equal(out.to_numpy(), A @ x)
    np.testing.assert_array_equal(k(**ops).to_numpy(), A @ x)


# schedule None or a serial csr one (one pass); the default suite covers every pair
@pytest.mark.parametrize(
    "case,other,out_format,schedule",
    covered(list(MATS), ["same", "nnz0", "shifted"], ["csr", "dcsr"], [None, "reorder(i,j)"]),
)
def test_sparse_add_csr(asan_cc, tmp_path, case, other, out_format, schedule):
    A = MATS[case]
    B = {"same": A, "nnz0": np.zeros_like(A), "shifted": np.roll(A, 1, axis=1) * 2}[other]
    k = ucf.compile(
        "S(i,j) = A(i,j) + B(i,j)",
        formats={"S": out_format, "A": "csr", "B": "csr"},
        schedule=schedule,
        target="c",
    )
    ops = {"A": _tensor(A, "csr"), "B": _tensor(B, "csr")}
    out = run_under_asan(
        asan_cc, tmp_path, k, out_format, A.shape, {"i": A.shape[0], "j": A.shape[1]}, ops
    )
    out.validate()
    np.testing.assert_array_equal(out.to_numpy(), A + B)
    coords, _ = out.to_coo()
    want = np.argwhere((A != 0) | (B != 0))
    np.testing.assert_array_equal(coords, want)
    py = k(**ops)
    np.testing.assert_array_equal(py.to_numpy(), A + B)


@pytest.mark.parametrize("case", ["random", "nnz0"])
@pytest.mark.parametrize(
    "expr,fill,value",
    [
        ("S(i,j) = A(i,j) + B(i,j)", "1", lambda a, b: a + b),
        ("S(i,j) = A(i,j) - A(i,j) + B(i,j)", "-inf", lambda a, b: a - a + b),
    ],
)
def test_sparse_add_of_filled_operands(asan_cc, tmp_path, case, expr, fill, value):
    """Operands that read as a fill where absent make the sum non-zero where both are
    absent, so their entries do not bound it: a serial add keeps the counting pass
    (the statement fuzzer, seed 44: one pass wrote past the arrays it had sized)."""
    A = np.where(MATS[case] != 0, MATS[case], float(fill))
    B = np.roll(MATS[case], 1, axis=1) * 2
    fa = f"csr fill={fill}"
    k = ucf.compile(expr, {"S": "csr", "A": fa, "B": "csr"}, schedule="reorder(i,j)", target="c")
    ops = {"A": _tensor(A, fa), "B": _tensor(B, "csr")}
    out = run_under_asan(
        asan_cc, tmp_path, k, "csr", A.shape, {"i": A.shape[0], "j": A.shape[1]}, ops
    )
    with np.errstate(invalid="ignore"):
        want = value(A, B)
    np.testing.assert_array_equal(out.to_numpy(), want)
    np.testing.assert_array_equal(k(**ops).to_numpy(), want)


@pytest.mark.parametrize("case", list(MATS))
@pytest.mark.parametrize("fmt", ["dcsr", "coo"])
def test_a_workspace_of_an_absent_operand_reads_nothing(asan_cc, tmp_path, case, fmt):
    """A's workspace under a row A does not store, beside a dense D: the producer read
    A's values at a position that was not A's (schedule fuzzer, seed 45)."""
    A = MATS[case]
    D = np.arange(1.0, A.size + 1).reshape(A.shape)
    k = ucf.compile(
        "C(i,j) = A(i,j) + D(i,j)", {"A": fmt}, schedule="precompute(A(i,j), j, j, w)", target="c"
    )
    ops = {"A": _tensor(A, fmt), "D": _tensor(D, "UU")}
    out = run_under_asan(
        asan_cc, tmp_path, k, "UU", A.shape, {"i": A.shape[0], "j": A.shape[1]}, ops
    )
    np.testing.assert_array_equal(out.to_numpy(), A + D)


@pytest.mark.parametrize("case", list(MATS))
@pytest.mark.parametrize("op", ["*", "+"])
@pytest.mark.parametrize("out_format", ["csr", "dcsr"])
def test_exported_sparse_output_is_finished_like_python(asan_cc, tmp_path, case, op, out_format):
    """Issue 19 item 5: the exported C filled DCSR pos[0] only if the caller zeroed
    it, kept rows whose entries all cancelled in an intersection, and left the
    CSR count to the caller. Now its arrays (from garbage-filled buffers) are the
    Python path's, array by array, and scipy's pattern."""
    A = MATS[case]
    B = np.roll(A, 1, axis=1) * 2  # rows of both whose product has no entry
    k = ucf.compile(
        f"S(i,j) = A(i,j) {op} B(i,j)",
        formats={"S": out_format, "A": "dcsr", "B": "dcsr"},
        target="c",
    )
    ops = {"A": _tensor(A, "dcsr"), "B": _tensor(B, "dcsr")}
    out = run_under_asan(
        asan_cc, tmp_path, k, out_format, A.shape, {"i": A.shape[0], "j": A.shape[1]}, ops
    )
    out.validate()
    py = k(**ops)
    for got, want in zip(out.levels, py.levels, strict=True):
        assert got.keys() == want.keys()
        for name in got:
            np.testing.assert_array_equal(got[name], want[name])
    np.testing.assert_array_equal(out.vals, py.vals)
    want = sp.csr_array(A * B if op == "*" else A + B)
    np.testing.assert_array_equal(out.to_scipy().toarray(), want.toarray())
    if out_format == "dcsr":  # no stored row without entries
        assert len(out.levels[0]["crd"]) == np.count_nonzero(np.diff(want.indptr))
        both = np.count_nonzero(A.any(axis=1) & B.any(axis=1))
        if op == "*" and case == "random":
            assert both > len(out.levels[0]["crd"]), "the case must drop a row"


def _tensor3_cases():
    rng = np.random.default_rng(11)
    t = rand_sparse(rng, (5, 6, 4), 0.2, empty_rows=2)
    single = np.zeros((3, 1, 2))
    single[2, 0, 1] = 4.0
    return {"random": t, "nnz0": np.zeros((3, 2, 4)), "single": single, "one": np.array([[[1.5]]])}


T3 = _tensor3_cases()


@pytest.mark.parametrize("case", list(T3))
@pytest.mark.parametrize("fc", ["U", "C"])
def test_ttv_csf(asan_cc, tmp_path, case, fc):
    B = T3[case]
    c = np.zeros(B.shape[2])
    c[::2] = np.arange(1, len(c[::2]) + 1)
    k = ucf.compile("A(i,j) = B(i,j,k) * c(k)", formats={"B": "csf", "c": fc}, target="c")
    ops = {"B": _tensor(B, "csf"), "c": _tensor(c, fc)}
    ext = dict(zip("ijk", B.shape, strict=True))
    out = run_under_asan(asan_cc, tmp_path, k, "UU", B.shape[:2], ext, ops)
    np.testing.assert_array_equal(out.to_numpy(), np.einsum("ijk,k->ij", B, c))


@pytest.mark.parametrize("case", list(T3))
def test_ttv_csf_sparse_output(asan_cc, tmp_path, case):
    B = T3[case]
    c = np.arange(1, B.shape[2] + 1, dtype=np.float64)
    k = ucf.compile("A(i,j) = B(i,j,k) * c(k)", formats={"A": "dcsr", "B": "csf"}, target="c")
    ops = {"B": _tensor(B, "csf"), "c": _tensor(c, "U")}
    ext = dict(zip("ijk", B.shape, strict=True))
    out = run_under_asan(asan_cc, tmp_path, k, "dcsr", B.shape[:2], ext, ops)
    want = np.einsum("ijk,k->ij", B, c)
    np.testing.assert_array_equal(out.to_numpy(), want)
    coords, _ = out.to_coo()
    np.testing.assert_array_equal(coords, np.argwhere(want != 0))


@pytest.mark.parametrize("case", list(MATS))
def test_spmv_coo(asan_cc, tmp_path, case):
    A = MATS[case]
    x = np.arange(1, A.shape[1] + 1, dtype=np.float64)
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "coo"}, target="c")
    ops = {"A": _tensor(A, "coo"), "x": _tensor(x, "U")}
    out = run_under_asan(
        asan_cc, tmp_path, k, "U", (A.shape[0],), {"i": A.shape[0], "j": A.shape[1]}, ops
    )
    np.testing.assert_array_equal(out.to_numpy(), A @ x)


EXTREMES = [
    ("y(i) = max(j, A(i,j))", "csr", lambda a: a.max(axis=1)),
    ("y(i) = min(j, A(i,j) - 1)", "dcsr", lambda a: (a - 1).min(axis=1)),
    ("y(j) = max(i, A(i,j))", "csc", lambda a: a.max(axis=0)),
    ("s = max(i, sum(j, A(i,j)))", "dcsr", lambda a: a.sum(axis=1).max()),
    ("s = min(i, j, A(i,j))", "coo", lambda a: a.min()),
]


@pytest.mark.parametrize("case", ["empty_rows", "one"])
@pytest.mark.parametrize(("expr", "fmt", "ref"), EXTREMES)
def test_a_max_walks_its_entries_and_folds_the_fill_once(asan_cc, tmp_path, case, expr, fmt, ref):
    """The loops of a max or min that skip the absent entries (issue 34), on empty rows
    and rows of one entry, and on a full 1 x 1 matrix (nothing folded in)."""
    A = MATS[case] * np.where(np.arange(MATS[case].size) % 2, 1, -1).reshape(MATS[case].shape)
    k = ucf.compile(expr, formats={"A": fmt}, target="c")
    ops = {"A": _tensor(A, fmt)}
    shape = () if expr.startswith("s") else (A.shape[1 if "y(j)" in expr else 0],)
    out = run_under_asan(
        asan_cc, tmp_path, k, "U" * len(shape), shape, {"i": A.shape[0], "j": A.shape[1]}, ops
    )
    np.testing.assert_array_equal(out.to_numpy(), ref(A))
    np.testing.assert_array_equal(np.asarray(k(**ops)), ref(A))


@pytest.mark.parametrize("case", list(T3))
def test_coo3_full_reduction(asan_cc, tmp_path, case):
    B = T3[case]
    k = ucf.compile(
        "s = B(i,j,k)", formats={"B": "coo"}, target="c", dtype="int64", index_dtype="int64"
    )
    Bi = (B * 2).astype(np.int64)
    ops = {"B": _tensor(Bi, "coo", np.int64, np.int64)}
    out = run_under_asan(asan_cc, tmp_path, k, "", (), dict(zip("ijk", B.shape, strict=True)), ops)
    assert out.to_numpy() == Bi.sum()


@pytest.mark.parametrize("case", list(MATS))
def test_spmm_dcsr_into_csr(asan_cc, tmp_path, case):
    A = MATS[case]
    rng = np.random.default_rng(3)
    B = rand_sparse(rng, (A.shape[1], 3), 0.5, empty_rows=1)
    k = ucf.compile(
        "C(i,k) = A(i,j) * B(j,k)",
        formats={"C": "csr", "A": "dcsr", "B": "csc"},
        target="c",
        dtype="float32",
    )
    ops = {"A": _tensor(A, "dcsr", dtype=np.float32), "B": _tensor(B, "csc", dtype=np.float32)}
    ext = {"i": A.shape[0], "j": A.shape[1], "k": 3}
    names = {p.role[1] for f in k.llir for p in f.params if p.role[0] not in ("extent", "counts")}
    if not names <= {"A", "B", "C"}:
        pytest.skip("kernel repacks an operand for its loop order")
    out = run_under_asan(asan_cc, tmp_path, k, "csr", (A.shape[0], 3), ext, ops)
    np.testing.assert_array_equal(out.to_numpy(), (A @ B).astype(np.float32))


GUSTAVSON = "precompute(A(i,j)*B(j,k),k,k,w)"


@pytest.mark.parametrize("case", list(MATS))
@pytest.mark.parametrize("fa", ["csr", "dcsr"])
@pytest.mark.parametrize("schedule", [GUSTAVSON, GUSTAVSON + "; parallelize(i,CPUThread,NoRaces)"])
def test_gustavson_workspace_stays_in_bounds(asan_cc, tmp_path, case, fa, schedule):
    """The row workspace, its touched list and the sort must stay inside their buffers."""
    A = MATS[case]
    B = np.roll(A, 1, axis=0).T.copy()
    k = ucf.compile(
        "C(i,k) = A(i,j) * B(j,k)",
        formats={"A": fa, "B": "csr", "C": "csr"},
        schedule=schedule,
        target="c",
    )
    ops = {"A": _tensor(A, fa), "B": _tensor(B, "csr")}
    n, m = A.shape
    out = run_under_asan(asan_cc, tmp_path, k, "csr", (n, n), {"i": n, "j": m, "k": n}, ops)
    out.validate()
    np.testing.assert_array_equal(out.to_numpy(), A @ B)


@pytest.mark.parametrize("cols", [40, 300])
def test_gustavson_radix_sort_stays_in_bounds(asan_cc, tmp_path, cols):
    """Rows of C longer than 32 entries (up to every column) take the bucketed or the
    radix sort, whose scratch and counters must hold them."""
    rng = np.random.default_rng(cols)
    B = np.zeros((4, cols))
    for r, n in enumerate([cols, 33, 0, cols // 2]):
        B[r, rng.choice(cols, n, replace=False)] = rng.integers(1, 5, n)
    A = np.array([[1.0, 0, 0, 2], [0, 3, 0, 0], [0, 0, 1, 0], [1, 1, 0, 1]])
    k = ucf.compile(
        "C(i,k) = A(i,j) * B(j,k)",
        formats={"A": "csr", "B": "csr", "C": "csr"},
        schedule=GUSTAVSON,
        target="c",
    )
    ops = {"A": _tensor(A, "csr"), "B": _tensor(B, "csr")}
    out = run_under_asan(asan_cc, tmp_path, k, "csr", (4, cols), {"i": 4, "j": 4, "k": cols}, ops)
    out.validate()
    np.testing.assert_array_equal(out.to_numpy(), A @ B)


def test_gustavson_sort_paths_stay_in_bounds(asan_cc, tmp_path):
    """Rows that take each path of the workspace's sort (ranks, buckets, the radix sort,
    the full row) stay inside its scratch and counters."""
    A, B = arrival_operands(np.random.default_rng(3), 5000)
    k = ucf.compile(
        "C(i,k) = A(i,j) * B(j,k)",
        formats={"A": "csr", "B": "csr", "C": "csr"},
        schedule=GUSTAVSON,
        target="c",
    )
    ops = {
        n: ucf.from_scipy(m, format="csr", index_dtype=np.int32) for n, m in [("A", A), ("B", B)]
    }
    (n, m), cols = A.shape, B.shape[1]
    out = run_under_asan(asan_cc, tmp_path, k, "csr", (n, cols), {"i": n, "j": m, "k": cols}, ops)
    out.validate()
    np.testing.assert_array_equal(out.to_numpy(), (A @ B).toarray())


def test_gustavson_bitmap_paths_stay_in_bounds(asan_cc, tmp_path):
    """Rows of C that read every word of the workspace's bitmap, the words its summary
    marks (10,000 columns: 157 words, 3 summary words), or sort, each after each, and a
    full row (the bitmap's reading writes its candidates past the list's last entry)."""
    rng = np.random.default_rng(11)
    cols, inner = 10_000, 120
    B = sp.random(inner, cols, density=10 / cols, format="csr", random_state=12)
    B = sp.vstack([B, sp.csr_matrix(np.ones((1, cols)))]).tocsr()
    lengths = [5, 5, 20, 1, 5, 0, 20, 20, 1, 1, 5]
    rows = [rng.choice(inner, n, replace=False) for n in lengths] + [[inner], [0, inner]]
    A = sp.lil_matrix((len(rows), inner + 1))
    for r, picked in enumerate(rows):
        A[r, picked] = 1.0 + r
    A = A.tocsr()
    k = ucf.compile(
        "C(i,k) = A(i,j) * B(j,k)",
        formats={"A": "csr", "B": "csr", "C": "csr"},
        schedule=GUSTAVSON,
        target="c",
    )
    ops = {n: ucf.from_scipy(m, index_dtype=np.int32) for n, m in [("A", A), ("B", B)]}
    n = A.shape[0]
    out = run_under_asan(
        asan_cc, tmp_path, k, "csr", (n, cols), {"i": n, "j": inner + 1, "k": cols}, ops
    )
    out.validate()
    np.testing.assert_array_equal(out.to_numpy(), (A @ B).toarray())


@pytest.mark.parametrize("rows", [1, 37, 65])
@pytest.mark.parametrize(
    "schedule",
    [
        None,
        "bound(k, kb, 8, MaxExact); split(kb, kt, kr, 4); reorder(i, kt, j, kr)",
        "split(i, i0, i1, 16); parallelize(i0, CPUThread, NoRaces)",
        "divide(i, i0, i1, 3); reorder(i0, i1, j, k)",
    ],
)
def test_kernel_zeroed_output_stays_in_bounds(asan_cc, tmp_path, rows, schedule):
    """Kernels that zero their output a row at a time (ucf.lower.zeroing) write inside it
    and clear every element, the driver's output starting as garbage."""
    rng = np.random.default_rng(rows)
    A = rand_sparse(rng, (rows, 9), 0.3, empty_rows=min(rows, 2))
    B = rng.random((9, 8))
    k = ucf.compile("C(i,k) = A(i,j) * B(j,k)", formats={"A": "csr"}, schedule=schedule, target="c")
    assert k._plan.writes_all, k.cin
    ops = {"A": _tensor(A, "csr"), "B": _tensor(B, "UU")}
    out = run_under_asan(asan_cc, tmp_path, k, "UU", (rows, 8), {"i": rows, "j": 9, "k": 8}, ops)
    np.testing.assert_allclose(out.to_numpy(), A @ B)


@pytest.mark.parametrize("rows", [37, 64, 65])
def test_split_tail_guard_stays_above_position_reads(asan_cc, tmp_path, rows):
    """A split of a split's inner loop guards the tail; the guard must sit above the loop
    whose bounds read A1_pos[i + 1], which does not exist past the last row."""
    rng = np.random.default_rng(rows)
    A = rand_sparse(rng, (rows, 9), 0.3, empty_rows=2)
    B = rng.random((9, 6))
    k = ucf.compile(
        "C(i,k) = A(i,j) * B(j,k)",
        formats={"A": "csr"},
        schedule="reorder(i,k,j); split(i,ib,i1,64); split(i1,it,ir,2); split(k,kb,kc,4); "
        "reorder(ib,kb,it,ir,kc,j)",
        target="c",
    )
    ops = {"A": _tensor(A, "csr"), "B": _tensor(B, "UU")}
    out = run_under_asan(asan_cc, tmp_path, k, "UU", (rows, 6), {"i": rows, "j": 9, "k": 6}, ops)
    np.testing.assert_allclose(out.to_numpy(), A @ B)


@pytest.mark.parametrize("case", list(T3))
def test_fused_positions_stay_in_bounds(asan_cc, tmp_path, case):
    """Fused pos over CSF: the per-block binary search and the parent walk."""
    T = T3[case]
    c = np.arange(1, T.shape[2] + 1, dtype=np.float64)
    k = ucf.compile(
        "A(i,j) = B(i,j,k) * c(k)",
        formats={"B": "csf"},
        schedule="fuse(i,j,f); pos(f,fpos,B); split(fpos,chunk,fpos2,3)",
        target="c",
    )
    ops = {"B": _tensor(T, "CCC"), "c": _tensor(c, "U")}
    i, j, kk = T.shape
    out = run_under_asan(asan_cc, tmp_path, k, "UU", (i, j), {"i": i, "j": j, "k": kk}, ops)
    np.testing.assert_array_equal(out.to_numpy(), T @ c)


def _padded_conv1d(a, b, stride, n_out, offset):
    """out[i] = sum_k a[stride*i + k + offset] * b[k], reading zeros outside a."""
    out = np.zeros(n_out)
    for i in range(n_out):
        for k in range(len(b)):
            x = stride * i + k + offset
            if 0 <= x < len(a):
                out[i] += a[x] * b[k]
    return out


@pytest.mark.parametrize("fa", ["U", "C"])
@pytest.mark.parametrize("fb", ["U", "C"])
@pytest.mark.parametrize("schedule", ["", "reorder(k,i)", None])
@pytest.mark.parametrize("n_out", [3, 9])
def test_affine_windows_and_guards_stay_in_bounds(asan_cc, tmp_path, fa, fb, schedule, n_out):
    """Strided, padded windows (searched, cursor-resumed, or guarded) with an output
    larger than the inferred one, so windows run off both ends of A."""
    rng = np.random.default_rng(11)
    a = rand_sparse(rng, (12,), 0.5)
    b = rand_sparse(rng, (4,), 0.7)
    k = ucf.compile(
        "C(i) = A(2*i+k-1) * B(k)", formats={"A": fa, "B": fb}, schedule=schedule, target="c"
    )
    ops = {"A": _tensor(a, fa), "B": _tensor(b, fb)}
    out = run_under_asan(asan_cc, tmp_path, k, "U", (n_out,), {"i": n_out, "k": 4}, ops)
    np.testing.assert_allclose(out.to_numpy(), _padded_conv1d(a, b, 2, n_out, -1))


@pytest.mark.parametrize("fi", ["UUU", "UUC", "UCC"])
def test_submanifold_conv_stays_in_bounds(asan_cc, tmp_path, fi):
    """Masked 2-D conv into a sparse output that takes the mask's pattern."""
    rng = np.random.default_rng(5)
    pts = rng.random((5, 6)) < 0.3
    pts[0, 0] = pts[4, 5] = True  # corners: windows clipped on both sides
    img = rng.random((5, 6, 2)) * pts[..., None]
    f = rng.random((3, 3, 2, 3))
    k = ucf.compile(
        "O(p,q,m) = Mask(p,q) * I(p+r-1,q+s-1,c) * F(r,s,c,m)",
        formats={"O": "UCU", "Mask": "UC", "I": fi},
        schedule="reorder(p,q,r,s,c,m)",
        target="c",
    )
    ops = {"Mask": _tensor(pts.astype(float), "UC"), "I": _tensor(img, fi), "F": _tensor(f, "UUUU")}
    ext = {"p": 5, "q": 6, "r": 3, "s": 3, "c": 2, "m": 3}
    out = run_under_asan(asan_cc, tmp_path, k, "UCU", (5, 6, 3), ext, ops)
    padded = np.pad(img, ((1, 1), (1, 1), (0, 0)))
    win = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(0, 1))
    ref = np.einsum("pqcrs,rscm->pqm", win, f) * pts[..., None]
    np.testing.assert_allclose(out.to_numpy(), ref)
    np.testing.assert_array_equal(out.levels[1]["crd"], np.nonzero(pts)[1])


@pytest.mark.parametrize("case", list(T3))
@pytest.mark.parametrize("out_format", ["UUU", "CCC"])
def test_flat_coiteration_reads_no_unmatched_position(asan_cc, tmp_path, case, out_format):
    """Four CSF operands meet at every level in one flat loop: an operand that did not
    match reads nothing below (empty ranges, guarded value loads)."""
    B = T3[case]
    ops_np = {"B": B, "C": np.roll(B, 1, axis=2) * 2, "D": np.zeros_like(B), "E": B[::-1] * 3}
    formats = dict.fromkeys(ops_np, "csf") | {"A": out_format}
    k = ucf.compile(
        "A(i,j,k) = B(i,j,k) + C(i,j,k) * (D(i,j,k) + E(i,j,k))", formats=formats, target="c"
    )
    ops = {n: _tensor(a, "csf") for n, a in ops_np.items()}
    ext = dict(zip("ijk", B.shape, strict=True))
    out = run_under_asan(asan_cc, tmp_path, k, out_format, B.shape, ext, ops)
    want = ops_np["B"] + ops_np["C"] * (ops_np["D"] + ops_np["E"])
    np.testing.assert_array_equal(out.to_numpy(), want)


@pytest.mark.parametrize("case", list(MATS))
@pytest.mark.parametrize("schedule", ["split(j,j0,j1,2)", "divide(j,j0,j1,3)"])
def test_coordinate_split_blocks_stay_in_bounds(asan_cc, tmp_path, case, schedule):
    """Each block's binary searches stay inside the operands' segments."""
    A = MATS[case]
    B = np.roll(A, 1, axis=1) * 2
    k = ucf.compile(
        "S(i,j) = A(i,j) + B(i,j)",
        formats={"S": "csr", "A": "csr", "B": "csr"},
        schedule=schedule,
        target="c",
    )
    ops = {"A": _tensor(A, "csr"), "B": _tensor(B, "csr")}
    out = run_under_asan(
        asan_cc, tmp_path, k, "csr", A.shape, dict(zip("ij", A.shape, strict=True)), ops
    )
    np.testing.assert_array_equal(out.to_numpy(), A + B)


def _scipy_in_place(m: sp.csr_array) -> ucf.Tensor:
    """A scipy CSR as a kernel call binds it (``ucf.exec.scipy_operands``): on its own
    arrays, bounds checked, order not."""
    from ucf.exec.scipy_operands import in_place

    t = in_place(m, "operand A")
    assert t is not None
    return t


def _non_canonical(seed: int) -> sp.csr_array:
    """Rows shuffled, a column repeated in every row of two or more, and spare entries
    past ``indptr[-1]`` (which the call cuts off, so the driver's buffers end at it)."""
    rng = np.random.default_rng(seed)
    a = sp.random(9, 7, density=0.4, format="csr", random_state=rng)
    indptr, indices = a.indptr.copy(), a.indices.copy()
    for r in range(a.shape[0]):
        lo, hi = indptr[r], indptr[r + 1]
        if hi - lo >= 2:
            indices[hi - 1] = indices[lo]
        indices[lo:hi] = rng.permutation(indices[lo:hi])
    spare = np.concatenate([indices, [0, 6]]).astype(indices.dtype)
    data = np.concatenate([a.data, [5.0, 6.0]])
    m = a.copy()
    m.indptr, m.indices, m.data = indptr, spare, data
    return m


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "expr,want",
    [
        ("y(i) = A(i,j) * x(j)", lambda a, x, z: a @ z),
        ("y(j) = A(i,j) * x(i)", lambda a, x, z: a.T @ x),
    ],
)
def test_unsorted_scipy_operand_read_in_place_stays_in_bounds(asan_cc, tmp_path, seed, expr, want):
    """What a call reads in place from a scipy CSR that passed its bounds checks but is
    not canonical (shuffled rows, repeated columns, entries past indptr[-1]) stays in
    the arrays under ASan, and gives scipy's answer (repeats summed)."""
    m = _non_canonical(seed)
    a = m.toarray()  # scipy's reading: repeats summed, the spare entries ignored
    x = np.arange(1.0, m.shape[0] + 1)
    z = np.arange(1.0, m.shape[1] + 1)
    k = ucf.compile(expr, formats={"A": "csr"}, target="c", schedule="")
    ops = {"A": _scipy_in_place(m), "x": _tensor(x if "x(i)" in expr else z, "U")}
    n = m.shape[1] if expr.startswith("y(j)") else m.shape[0]
    out = run_under_asan(asan_cc, tmp_path, k, "U", (n,), {"i": m.shape[0], "j": m.shape[1]}, ops)
    np.testing.assert_allclose(out.to_numpy(), want(a, x, z), rtol=1e-12)


def test_a_merge_over_an_unsorted_operand_stays_in_bounds(asan_cc, tmp_path):
    """A merge relies on order for its answer, never for its memory: fed an unsorted A
    (which a call never does: it repacks A first), it reads only A's and B's arrays.
    So a stale order could cost an answer, never an out-of-bounds read."""
    m = _non_canonical(2)
    b = sp.random(9, 7, density=0.4, format="csr", random_state=3)
    k = ucf.compile(
        "S(i,j) = A(i,j) + B(i,j)", formats={"S": "csr", "A": "csr", "B": "csr"}, target="c"
    )
    ops = {"A": _scipy_in_place(m), "B": ucf.from_scipy(b)}
    run_under_asan(asan_cc, tmp_path, k, "csr", m.shape, {"i": 9, "j": 7}, ops)


def _shuffled_coo(seed: int) -> sp.coo_array:
    """A COO with sorted rows, its columns shuffled and repeated within rows, and an
    empty first and last row: what a call reads in place for a COO kernel."""
    m = _non_canonical(seed)
    n = int(m.indptr[-1])
    rows = np.repeat(np.arange(m.shape[0]), np.diff(m.indptr)).astype(np.int32)
    keep = (rows > 0) & (rows < m.shape[0] - 1)
    return sp.coo_array((m.data[:n][keep], (rows[keep], m.indices[:n][keep])), shape=m.shape)


@pytest.mark.parametrize(
    "expr,want",
    [
        ("y(i) = A(i,j) * x(j)", lambda a, x, z: a @ z),
        ("y(j) = A(i,j) * x(i)", lambda a, x, z: a.T @ x),
    ],
)
@pytest.mark.parametrize("layout", ["coo", "dcsr", "coo as csr"])
def test_coo_and_dcsr_views_read_in_place_stay_in_bounds(asan_cc, tmp_path, expr, want, layout):
    """A scipy COO bound in place (rows sorted, columns shuffled and repeated) for a
    COO kernel, or as a CSR view for a CSR one, and a non-canonical CSR bound as a
    DCSR view (rows found from indptr, entries past indptr[-1] cut off) for a DCSR
    kernel: the kernel reads only their arrays under ASan, and gives scipy's answer."""
    from ucf.exec.scipy_operands import bind, compressed_rows, hypersparse

    m = _shuffled_coo(4) if layout.startswith("coo") else _non_canonical(5)
    t = bind(m, "A")
    assert t is not None
    if layout == "dcsr":
        t = hypersparse(t)
    if layout == "coo as csr":
        t, layout = compressed_rows(t), "csr"
    a = m.toarray()
    x = np.arange(1.0, m.shape[0] + 1)
    z = np.arange(1.0, m.shape[1] + 1)
    k = ucf.compile(expr, formats={"A": layout}, target="c", schedule="")
    ops = {"A": t, "x": _tensor(x if "x(i)" in expr else z, "U")}
    n = m.shape[1] if expr.startswith("y(j)") else m.shape[0]
    out = run_under_asan(asan_cc, tmp_path, k, "U", (n,), {"i": m.shape[0], "j": m.shape[1]}, ops)
    np.testing.assert_allclose(out.to_numpy(), want(a, x, z), rtol=1e-12)
