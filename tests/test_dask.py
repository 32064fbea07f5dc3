"""ucf.dask.einsum against scipy and numpy: Dask's threaded scheduler for the breadth,
and a two-process ``distributed.LocalCluster`` for the statements of issue 18."""

from __future__ import annotations

import sys

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp

import ucf
import ucf.dask as ud
from tests.helpers import TARGETS

SPMV = "y(i) = A(i,j) * x(j)"
SPMM = "C(i,k) = A(i,j) * B(j,k)"
SDDMM = "D(i,j) = S(i,j) * U(i,k) * V(j,k)"
ADD = "T(i,j) = A(i,j) + B(i,j)"


def sparse(rows, cols, density, seed, fmt="csr"):
    rng = np.random.default_rng(seed)  # a Generator: an int seed makes 20,000^2 take a minute
    return sp.random(rows, cols, density=density, format=fmt, random_state=rng)


def dense(shape, seed):
    return np.random.default_rng(seed).uniform(-1, 1, shape)


def chunked(m, chunks):
    return da.from_array(m, chunks=chunks, asarray=False)


def to_dense(x):
    return x.toarray() if sp.issparse(x) else np.asarray(x)


def close(got, want):
    if sp.issparse(got) and sp.issparse(want):  # never densify a 20,000^2 result
        assert got.shape == want.shape
        scale = abs(want).max() if want.nnz else 1.0
        assert abs(got - want).max() <= 1e-10 * scale
        return
    np.testing.assert_allclose(to_dense(got), to_dense(want), rtol=1e-10, atol=1e-12)


def statements(a, b, x, dx, s, u, v):
    """(statement, formats, operands, reference) for the four statements of the issue."""
    return [
        (SPMV, None, {"A": a, "x": dx}, lambda: a.compute() @ x),
        (SPMM, None, {"A": a, "B": b}, lambda: a.compute() @ b.compute()),
        (
            SDDMM,
            {"D": "csr"},
            {"S": s, "U": u, "V": v},
            lambda: s.compute().multiply(u.compute() @ v.compute().T),
        ),
        (ADD, {"T": "csr"}, {"A": a, "B": s}, lambda: a.compute() + s.compute()),
    ]


def small_operands(seed=0):
    a = chunked(sparse(90, 70, 0.1, seed), (25, 30))  # uneven: 25,25,25,15 x 30,30,10
    x = dense(70, seed + 1)
    s = chunked(sparse(90, 70, 0.1, seed + 2), (25, 30))
    return (
        a,
        chunked(dense((70, 6), seed + 3), (30, 4)),
        x,
        chunked(x, 30),
        s,
        chunked(dense((90, 5), seed + 4), (25, 2)),
        chunked(dense((70, 5), seed + 5), (30, 2)),
    )


# --------------------------------------------------------------------------- threads


@pytest.mark.parametrize("case", range(4), ids=["spmv", "spmm", "sddmm", "add"])
@pytest.mark.parametrize("target", TARGETS)
def test_statements_on_threads(case, target):
    stmt, formats, ops, want = statements(*small_operands())[case]
    got = ud.einsum(stmt, formats=formats, target=target, **ops)
    result = got.compute(scheduler="threads")
    close(result, want())
    if formats:  # a sparse output stays scipy, chunk by chunk
        assert sp.issparse(result)
        assert all(sp.issparse(d.compute(scheduler="threads")) for d in got.to_delayed().ravel())


def test_output_chunks_follow_the_operands():
    a, b, _, dx, *_ = small_operands()
    assert ud.einsum(SPMV, A=a, x=dx).chunks == (a.chunks[0],)
    assert ud.einsum(SPMM, A=a, B=b).chunks == (a.chunks[0], b.chunks[1])
    blocks = ud.einsum(ADD, formats={"T": "csr"}, A=a, B=a).to_delayed()
    assert blocks.shape == a.numblocks
    assert all(isinstance(d.compute(), sp.csr_matrix) for d in blocks.ravel())


def test_a_lone_block_reaches_its_task_without_a_copy(monkeypatch):
    """A contracted axis in one block is not joined by Dask, which copied the block: a
    whole dense B per task (about 70 ms per 500 MB task on this machine)."""
    m = sparse(60, 50, 0.1, 13)
    b = dense((50, 4), 14)
    seen = []
    operand = ud._operand
    monkeypatch.setattr(ud, "_operand", lambda blk, *a: seen.append(blk) or operand(blk, *a))
    lone = da.from_delayed(dask.delayed(b), shape=b.shape, dtype=b.dtype)  # not copied
    got = ud.einsum(SPMM, A=chunked(m, (20, 50)), B=lone)
    close(got.compute(scheduler="synchronous"), m @ b)
    dense_blocks = [x for x in seen if isinstance(x, np.ndarray)]
    assert len(dense_blocks) == 3 and all(np.shares_memory(x, b) for x in dense_blocks)
    split = ud.einsum(SPMV, A=chunked(m, (20, 25)), x=chunked(dense(50, 15), 25))
    close(split.compute(scheduler="synchronous"), m @ dense(50, 15))


def test_an_unordered_output_needs_one_block_along_a_summed_axis():
    m = sparse(30, 20, 0.2, 16)
    n = sparse(20, 10, 0.2, 17)
    stmt, fmts = "C(i,n) = A(i,k) * B(k,n)", {"A": "csr", "B": "csr", "C": "UQ"}
    with pytest.raises(ucf.UnsupportedError, match="output C in 'UQ'.*level 1 is unordered"):
        ud.einsum(stmt, fmts, A=chunked(m, (10, 7)), B=chunked(n, (7, 5)))
    got = ud.einsum(stmt, fmts, A=chunked(m, (10, 20)), B=chunked(n, (20, 5))).compute()
    close(to_dense(got), (m @ n).toarray())


def test_misaligned_chunks_are_rechunked():
    m = sparse(100, 120, 0.05, 3)
    x = dense(120, 4)
    got = ud.einsum(SPMV, A=chunked(m, (33, 50)), x=chunked(x, 45))
    close(got.compute(), m @ x)


def test_empty_chunks():
    m = sparse(60, 50, 0.1, 5).tolil()
    m[20:40, :] = 0  # an all-zero row block
    m = m.tocsr()
    m.eliminate_zeros()
    a = da.from_array(m, chunks=((20, 0, 20, 20, 0), (0, 25, 25)), asarray=False)
    x = dense(50, 6)
    b = dense((50, 3), 7)
    close(ud.einsum(SPMV, A=a, x=chunked(x, ((0, 25, 25),))).compute(), m @ x)
    close(ud.einsum(SPMM, A=a, B=chunked(b, ((0, 25, 25), 3))).compute(), m @ b)
    close(ud.einsum(ADD, formats={"T": "csr"}, A=a, B=a).compute(), m + m)


def test_an_empty_matrix():
    m = sp.csr_matrix((40, 30))
    x = dense(30, 8)
    close(ud.einsum(SPMV, A=chunked(m, (10, 10)), x=chunked(x, 10)).compute(), m @ x)


def test_a_nested_reduction_keeps_its_blocks_whole():
    """``A x + b`` must not add ``b`` once per column block of ``A``."""
    m = sparse(50, 40, 0.2, 9)
    x, b = dense(40, 10), dense(50, 11)
    got = ud.einsum("y(i) = A(i,j) * x(j) + b(i)", A=chunked(m, (20, 15)), x=chunked(x, 15), b=b)
    close(got.compute(), m @ x + b)


def test_scalar_output_and_scalar_operand():
    x, y = dense(70, 12), dense(70, 13)
    got = ud.einsum("s = a * x(i) * y(i)", a=2.5, x=chunked(x, 20), y=chunked(y, 30))
    assert got.shape == ()
    np.testing.assert_allclose(got.compute(), 2.5 * x @ y)


def test_three_way_contraction():
    """Two contracted block axes: the reduction adds partials over both."""
    rng = np.random.default_rng(14)
    t = rng.uniform(-1, 1, (12, 10, 8)) * (rng.random((12, 10, 8)) < 0.3)
    u, v = dense((10, 4), 15), dense((8, 4), 16)
    got = ud.einsum(
        "M(i,r) = T(i,j,k) * U(j,r) * V(k,r)",
        formats={"T": "csf"},
        T=chunked(t, (5, 4, 3)),
        U=chunked(u, (4, 2)),
        V=chunked(v, (3, 2)),
    )
    close(got.compute(), np.einsum("ijk,jr,kr->ir", t, u, v))


@pytest.mark.parametrize("fmt", ["csc", "coo"])
def test_other_scipy_chunks(fmt):
    m = sparse(60, 45, 0.1, 17)
    b = dense((45, 3), 18)
    a = chunked(m, (20, 15)).map_blocks(lambda c: c.asformat(fmt), meta=m[:0, :0].asformat(fmt))
    assert a.blocks[0, 0].compute().format == fmt
    close(ud.einsum(SPMM, A=a, B=chunked(b, (15, 3))).compute(), m @ b)


def test_formats_convert_dense_chunks():
    m = sparse(40, 30, 0.2, 19).toarray()
    x = dense(30, 20)
    got = ud.einsum(SPMV, formats={"A": "csr"}, A=chunked(m, (15, 10)), x=chunked(x, 10))
    close(got.compute(), m @ x)


def test_ucf_tensor_chunks():
    m = sparse(50, 40, 0.1, 21)
    a = chunked(m, (20, 20)).map_blocks(ucf.from_scipy, meta=np.empty((0, 0)))
    x = dense(40, 22)
    close(ud.einsum(SPMV, formats={"A": "csr"}, A=a, x=chunked(x, 20)).compute(), m @ x)
    total = ud.einsum(ADD, formats={"A": "csr", "B": "csr", "T": "csr"}, A=a, B=a)
    blocks = [d.compute() for d in total.to_delayed().ravel()]
    assert all(isinstance(t, ucf.Tensor) and str(t.format) == "UC" for t in blocks)
    whole = total.compute()  # Dask joins Tensor chunks into one Tensor
    assert isinstance(whole, ucf.Tensor)
    close(whole.to_scipy(), 2 * m)
    with pytest.raises(ucf.OperandError, match=r"pass formats=\{'A': 'UC'\}"):
        ud.einsum(SPMV, A=a, x=chunked(x, 20)).compute()


def test_pydata_sparse_chunks():
    sparse_mod = pytest.importorskip("sparse")
    m = sparse(40, 30, 0.2, 23)
    a = da.from_array(sparse_mod.COO.from_scipy_sparse(m), chunks=(15, 10), asarray=False)
    x = dense(30, 24)
    close(ud.einsum(SPMV, A=a, x=chunked(x, 10)).compute(), m @ x)
    total = ud.einsum(ADD, formats={"T": "csr"}, A=a, B=a).compute()
    assert isinstance(total, sparse_mod.COO)
    close(total.todense(), 2 * m)


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_value_dtypes(dtype):
    m = (sparse(30, 20, 0.2, 25) * 10).astype(np.int64).astype(dtype)
    x = np.arange(20, dtype=dtype)
    got = ud.einsum(SPMV, A=chunked(m, (10, 10)), x=chunked(x, 10))
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.compute(), m @ x)


def test_balanced_rows_even_out_nonzeros():
    rng = np.random.default_rng(26)
    per_row = (2000 / np.sqrt(np.arange(1, 2001))).astype(int)  # skewed: early rows are heavy
    rows = np.repeat(np.arange(2000), per_row)
    cols = rng.integers(0, 300, len(rows))
    m = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(2000, 300))

    def block_nnz(chunks):
        ends = np.cumsum(chunks)
        return [m[e - c : e].nnz for e, c in zip(ends, chunks, strict=True)]

    chunks = ud.balanced_rows(m, 4, row_weight=0)
    assert sum(chunks) == 2000 and len(chunks) == 4
    assert max(block_nnz(chunks)) < 1.1 * min(block_nnz(chunks))
    assert max(block_nnz((500,) * 4)) > 2 * min(block_nnz((500,) * 4))  # what it avoids
    x = dense(300, 27)
    close(ud.einsum(SPMV, A=chunked(m, (chunks, -1)), x=x).compute(), m @ x)


def test_balanced_rows_count_each_row_as_work():
    """A few long rows then many one-nonzero rows: equal nonzeros would give the last
    block most of the rows; by default a row weighs as much as a nonzero."""
    heavy, light = 100, 20_000
    per_row = np.concatenate((np.full(heavy, 200), np.ones(light, int)))
    rows = np.repeat(np.arange(heavy + light), per_row)
    cols = np.random.default_rng(27).integers(0, 500, len(rows))
    m = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(heavy + light, 500))

    def block_work(chunks, row_weight):
        ends = np.cumsum(chunks)
        return [m[e - c : e].nnz + row_weight * c for e, c in zip(ends, chunks, strict=True)]

    by_work = ud.balanced_rows(m, 4)
    assert sum(by_work) == heavy + light
    assert max(block_work(by_work, 1)) < 1.05 * min(block_work(by_work, 1))
    by_nnz = ud.balanced_rows(m, 4, row_weight=0)
    assert max(block_work(by_nnz, 1)) > 1.5 * min(block_work(by_nnz, 1))  # what it avoids
    heavier = ud.balanced_rows(m, 4, row_weight=3.0)
    assert max(block_work(heavier, 3)) < 1.05 * min(block_work(heavier, 3))


@pytest.mark.parametrize("weight", [-1, float("nan"), float("inf"), True, "1"])
def test_balanced_rows_refuse_a_bad_row_weight(weight):
    with pytest.raises(ucf.OperandError, match="row_weight"):
        ud.balanced_rows(sp.csr_matrix((4, 4)), 2, row_weight=weight)


# --------------------------------------------------------------------------- errors


def test_affine_indices_are_refused():
    a = chunked(dense((10, 10), 28), 5)
    with pytest.raises(ucf.UnsupportedError, match=r"'i \+ 1' of A \(mode 0\)"):
        ud.einsum("y(i) = A(i+1,j) * x(j)", A=a, x=chunked(dense(10, 29), 5))


@pytest.mark.parametrize(
    "stmt, operands, error, match",
    [
        (SPMV, {"A": "a"}, ucf.OperandError, "missing operand x"),
        (SPMV, {"A": "a", "x": "x", "z": "x"}, ucf.OperandError, "unknown operand z"),
        (SPMV, {"A": "a", "x": "x20"}, ucf.ShapeError, "index variable j has extent 10"),
        (SPMV, {"A": "x", "x": "x"}, ucf.ShapeError, "operand A has order 1"),
        ("y(i) += A(i,j) * x(j)", {"A": "a", "x": "x"}, ucf.UnsupportedError, r"'\+='"),
        ("C(i,k) = A(i,j) * A(j,k)", {"A": "a"}, ucf.UnsupportedError, "read as A"),
        ("y(i,k) = A(i,j) * x(j)", {"A": "a", "x": "x"}, ucf.UnsupportedError, "only in the"),
        (SPMV, {"A": "a", "x": "list"}, ucf.OperandError, "unsupported type list"),
        (SPMV, {"A": "tensor", "x": "x"}, ucf.OperandError, "is a ucf Tensor"),
        ("y(i) = A(i,j) * x(j", {"A": "a", "x": "x"}, ucf.ParseError, "end of input"),
    ],
)
def test_bad_input(stmt, operands, error, match):
    values = {
        "a": chunked(sparse(10, 10, 0.3, 30), 5),
        "x": chunked(dense(10, 31), 5),
        "x20": chunked(dense(20, 31), 5),
        "list": [1.0] * 10,
        "tensor": ucf.from_scipy(sparse(10, 10, 0.3, 30)),
    }
    with pytest.raises(error, match=match):
        ud.einsum(stmt, **{k: values[v] for k, v in operands.items()})


def test_a_bad_schedule_fails_before_any_task_runs():
    a, _, _, dx, *_ = small_operands()
    with pytest.raises(ucf.ScheduleError):
        ud.einsum(SPMV, schedule="reorder(j,q)", A=a, x=dx)


def test_without_dask(monkeypatch):
    monkeypatch.setitem(sys.modules, "dask.array", None)
    with pytest.raises(ucf.UcfError, match=r"pip install '\.\[dask\]' in a ucf checkout"):
        ud.einsum(SPMV, A=np.eye(3), x=np.ones(3))


# --------------------------------------------------------------------------- LocalCluster


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes, one thread each: every task crosses a process boundary,
    and workers load kernels from the disk cache the test process filled."""
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as c,
        distributed.Client(c) as client,
        dask.config.set(scheduler=client),
    ):
        yield client


@pytest.mark.parametrize("case", range(4), ids=["spmv", "spmm", "sddmm", "add"])
def test_statements_on_a_local_cluster(cluster, case):
    stmt, formats, ops, want = statements(*small_operands(40))[case]
    got = ud.einsum(stmt, formats=formats, **ops).compute()
    close(got, want())
    workers = cluster.run(lambda: "ucf.dask" in sys.modules)
    assert len(workers) == 2 and all(workers.values())


def test_a_4x4_chunked_20000_matrix_on_a_local_cluster(cluster):
    n = 20_000
    m = sparse(n, n, 1e-4, 41)
    a = chunked(m, (n // 4, n // 4))
    assert a.numblocks == (4, 4)
    x, b = dense(n, 42), dense((n, 8), 43)
    close(ud.einsum(SPMV, A=a, x=chunked(x, n // 4)).compute(), m @ x)
    close(ud.einsum(SPMM, A=a, B=chunked(b, (n // 4, 8))).compute(), m @ b)
    close(ud.einsum(ADD, formats={"T": "csr"}, A=a, B=a).compute(), 2 * m)


def test_uneven_and_empty_chunks_on_a_local_cluster(cluster):
    m = sparse(70, 50, 0.1, 44)
    a = da.from_array(m, chunks=((30, 0, 33, 7), (0, 20, 17, 13)), asarray=False)
    b = dense((50, 4), 45)
    close(ud.einsum(SPMM, A=a, B=chunked(b, (25, 3))).compute(), m @ b)
    g = ud.einsum("G(i,k) = A(i,j) * B(j,k)", formats={"G": "csr", "B": "csc"}, A=a, B=a.T)
    close(g.compute(), m @ m.T)
