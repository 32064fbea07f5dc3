"""The default schedule's cost model (ucf.schedule.cpu_model): what it decides is checked on
the plan (``k.cin``), and every kernel it picks is checked against numpy/scipy."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import (
    TARGETS,
    rand_dense,
    rand_sparse,
    whole_team,
)
from tests.schedule.cases import DOT, dense, names, pack
from ucf.schedule import cpu_model
from ucf.schedule.stats import MAX_SHARES, SKEWED, Stats

SPMV = "y(i) = A(i,j) * x(j)"
SPMM = "C(i,k) = A(i,j) * B(j,k)"


@pytest.fixture(autouse=True)
def _two_threads(monkeypatch):
    """The model plans for the threads a call gets; make that 2 whatever the machine, and
    let the small inputs here have plans of their own."""
    ucf.set_num_threads(2)
    monkeypatch.setattr(cpu_model, "REPLAN_WORK", 0)
    yield


def rand_csr(rng, rows: int, cols: int, per_row: float) -> sp.csr_array:
    nnz = int(rows * per_row)
    r, c = rng.integers(0, rows, nnz), rng.integers(0, cols, nnz)
    m = sp.csr_array((rng.integers(1, 9, nnz).astype(float), (r, c)), shape=(rows, cols))
    m.sum_duplicates()
    return m


def chosen(k: ucf.Kernel) -> list[str]:
    return [line.strip()[2:] for line in k.cin.splitlines() if "# default:" in line]


def parallel_loop(k: ucf.Kernel) -> str | None:
    loops = [line.split()[2] for line in k.cin.splitlines() if "runs in parallel" in line]
    return loops[0] if loops else None


# ------------------------------------------------------------------ Gustavson workspace


@pytest.mark.parametrize(
    "formats",
    [
        {"A": "csr", "B": "csr", "C": "csr"},
        {"A": "dcsr", "B": "dcsr", "C": "dcsr"},
        {"A": "csr", "B": "dcsr", "C": "csr"},
        {"A": "csc", "B": "csc", "C": "csc"},
    ],
    ids=["csr", "dcsr", "csr-dcsr", "csc"],
)
def test_spgemm_default_is_never_quadratic(formats, target):
    """A sparse output whose storage order puts the reduction outside an output variable
    gets a workspace, and every operand is read as stored: co-iterating each output entry
    with the reduction (converting B to the other orientation) is the quadratic plan."""
    rng = np.random.default_rng(7)
    A, B = rand_csr(rng, 300, 200, 4), rand_csr(rng, 200, 250, 4)
    k = ucf.compile(SPMM, formats=formats, target=target)
    for _ in range(2):  # before a call (no statistics), then after one
        assert "precomputed into workspace" in k.cin, k.cin
        assert "converted" not in k.cin, k.cin
        C = k(A=A, B=B)
    assert abs(C.to_scipy() - A @ B).max() == 0
    assert any("Gustavson" in w for w in chosen(k)), k.cin


@pytest.mark.parametrize("fa", ["csr", "dcsr"])
def test_spgemm_plus_a_matrix_gathers_both_terms_in_one_workspace(fa, target):
    """A sum of products: each term scatters its rows into one workspace over k, D (a
    term with no sum of its own) once per row beside the sum over j, so no loop
    co-iterates every (i, k) of C. With A in dcsr, a row A lacks adds D alone (the
    producer of A*B folds away there: it read past A's entries before)."""
    rng = np.random.default_rng(8)
    A, B, D = rand_csr(rng, 60, 50, 3), rand_csr(rng, 50, 40, 3), rand_csr(rng, 60, 40, 2)
    A[:10] = 0  # rows A lacks, D has
    A.eliminate_zeros()
    k = ucf.compile(
        "C(i,k) = A(i,j) * B(j,k) + D(i,k)",
        formats={"A": fa, "B": "csr", "D": "csr", "C": "csr"},
        target=target,
    )
    C = k(A=ucf.from_scipy(A, format=fa), B=B, D=D)
    assert abs(C.to_scipy() - (A @ B + D)).max() == 0
    assert "A(i, j) * B(j, k) + D(i, k) is precomputed into workspace w(k)" in k.cin
    assert "converted" not in k.cin


# ------------------------------------------------------------------ the parallel loop


def test_extent_one_loop_is_not_the_parallel_loop(target):
    """Batch 1: the default runs the output channels in parallel, not n."""
    rng = np.random.default_rng(9)
    image = rand_dense(rng, (1, 16, 200))
    W = rand_dense(rng, (32, 16, 3)) * (rng.random((32, 16, 3)) < 0.4)
    expr = "O(n,m,p) = I(n,c,p+r) * W(m,c,r)"
    k = ucf.compile(expr, formats={"W": "UCC"}, target=target)
    got = k(I=image, W=ucf.from_numpy(W, format="UCC"), shapes={"p": 198}).to_numpy()
    want = np.einsum("ncpr,mcr->nmp", np.lib.stride_tricks.sliding_window_view(image, 3, 2), W)
    assert np.allclose(got, want)
    assert parallel_loop(k) not in (None, "n"), k.cin
    assert any("n has 1" in w for w in chosen(k)), k.cin


def test_one_thread_runs_serially():
    rng = np.random.default_rng(3)
    A, x = rand_csr(rng, 5000, 5000, 20), rng.random(5000)
    k = ucf.compile(SPMV, formats={"A": "csr"})
    ucf.set_num_threads(1)
    assert np.allclose(k(A=A, x=x).to_numpy(), A @ x)
    assert parallel_loop(k) is None and any("one thread" in w for w in chosen(k)), k.cin
    ucf.set_num_threads(2)
    assert np.allclose(k(A=A, x=x).to_numpy(), A @ x)
    assert parallel_loop(k) is not None, k.cin


def test_even_rows_are_shared_statically_and_skewed_rows_in_chunks(target):
    """A few dense rows: dynamically scheduled chunks, so the long rows do not all land on
    one thread; even rows: one static block per thread, the cheapest schedule."""
    rng = np.random.default_rng(5)
    even = rand_csr(rng, 20000, 3000, 8)
    skewed = even.tolil()
    skewed[::2000] = rng.random((10, 3000))
    skewed = sp.csr_array(skewed)
    x = rng.random(3000)
    for A, chunks in ((even, False), (skewed, True)):
        k = ucf.compile(SPMV, formats={"A": "csr"}, target=target)
        assert np.allclose(k(A=A, x=x).to_numpy(), A @ x)
        assert any("chunks of" in w for w in chosen(k)) == chunks, k.cin
        assert parallel_loop(k) == ("i_c" if chunks else "i"), k.cin


def rows_sorted_by_length(rng, rows: int, cols: int, longest: int) -> sp.csr_array:
    """Row r holds about r * longest / rows entries (a triangular factor's profile): no
    row is long next to the mean, but the last half of the rows holds most entries."""
    lengths = (np.arange(rows) * longest) // rows
    r = np.repeat(np.arange(rows, dtype=np.int32), lengths)
    c = rng.integers(0, cols, r.size, dtype=np.int32)
    m = sp.csr_array((rng.integers(1, 9, r.size).astype(float), (r, c)), shape=(rows, cols))
    m.sum_duplicates()
    return m


def static_shares(m: sp.csr_array, threads: int) -> float:
    """The largest share of entries OpenMP's static schedule (ceil(rows / threads) rows
    per thread) gives one thread, over the mean share, counted row by row."""
    lengths = np.diff(m.indptr)
    step = -(-m.shape[0] // threads)
    per = [lengths[t * step : (t + 1) * step].sum() for t in range(threads)]
    return max(per) * threads / lengths.sum()


def test_imbalance_is_the_static_split_of_the_rows():
    from ucf.schedule.stats import segments

    rng = np.random.default_rng(14)
    cases = [rows_sorted_by_length(rng, 1001, 50, 30), rand_csr(rng, 777, 90, 5)]
    for m in (*cases, rand_csr(rng, 3, 10, 3)):
        spread, shares = segments(ucf.from_scipy(m, format="csr"))
        lengths = np.diff(m.indptr)
        assert spread == pytest.approx(lengths.max() / lengths.mean())
        assert len(shares) == MAX_SHARES - 1
        for threads in (2, 3, 7, 64):
            assert shares[threads - 2] == pytest.approx(static_shares(m, threads))


def test_rows_sorted_by_length_go_in_chunks(target):
    """No row is 4x the mean, so the spread alone would split rows statically, but one of
    two threads would get 1.5x its share: the rows go in dynamically scheduled chunks."""
    rng = np.random.default_rng(15)
    A, x = rows_sorted_by_length(rng, 20000, 3000, 8), rng.random(3000)
    assert np.diff(A.indptr).max() / np.diff(A.indptr).mean() < SKEWED
    k = ucf.compile(SPMV, formats={"A": "csr"}, target=target)
    assert np.allclose(k(A=A, x=x).to_numpy(), A @ x)
    share = f"gives one of 2 threads {static_shares(A, 2):.2f}x its share"
    assert parallel_loop(k) == "i_c" and any(share in w for w in chosen(k)), k.cin


def test_slices_are_weighed_by_their_entries_not_their_fibers(target):
    """A 3-tensor whose slices all hold 40 fibers, the first half's 10x longer: split
    by fibers it looks even, by entries one of two threads gets 1.8x its share, and TTV's
    slices go in chunks (the spread, of fibers per slice, is 1)."""
    from ucf.schedule.stats import segments

    rng = np.random.default_rng(17)
    n = 200
    coords = []
    for i in range(n):
        for j in rng.choice(n, 40, replace=False):
            ks = rng.choice(n, 20 if i < n // 2 else 2, replace=False)
            coords += [(i, j, k) for k in ks]
    coords = np.array(sorted(coords))
    vals = rng.integers(1, 9, len(coords)).astype(float)
    B = ucf.from_coo(coords, vals, (n, n, n), format="csf")
    per = np.bincount(coords[:, 0] // (n // 2), minlength=2)
    assert segments(B)[1][0] == pytest.approx(per.max() * 2 / per.sum())
    c = rng.random(n)
    k = ucf.compile("A(i,j) = B(i,j,k) * c(k)", formats={"B": "csf"}, target=target)
    want = np.zeros((n, n))
    np.add.at(want, (coords[:, 0], coords[:, 1]), vals * c[coords[:, 2]])
    assert np.allclose(k(B=B, c=c).to_numpy(), want)
    share = f"gives one of 2 threads {per.max() * 2 / per.sum():.2f}x its share"
    assert parallel_loop(k) == "i_c" and any(share in w for w in chosen(k)), k.cin


def test_reduction_outer_loop_stays_serial():
    """CSC SpMV: the outer loop is the reduction and i cannot move outside it, so a
    parallel region per column would be the only option; the default stays serial."""
    rng = np.random.default_rng(6)
    A, x = rand_csr(rng, 3000, 3000, 10), rng.random(3000)
    k = ucf.compile(SPMV, formats={"A": "csc"})
    assert np.allclose(k(A=sp.csc_array(A), x=x).to_numpy(), A @ x)
    assert parallel_loop(k) is None, k.cin


# ------------------------------------------------------------------ bound and shape changes


def test_bound_follows_the_call_and_a_new_extent_gets_a_new_kernel(target):
    rng = np.random.default_rng(10)
    A = rand_csr(rng, 4000, 300, 6)
    k = ucf.compile(SPMM, formats={"A": "csr"}, target=target)
    for n in (32, 16, 33):
        B = rng.random((300, n))
        assert np.allclose(k(A=A, B=B).to_numpy(), A @ B)
        assert any(f"bound(k) to {n}" in w for w in chosen(k)), k.cin


def test_same_statistics_reuse_the_kernel():
    rng = np.random.default_rng(11)
    A, x = rand_csr(rng, 8000, 8000, 5), rng.random(8000)
    k = ucf.compile(SPMV, formats={"A": "csr"})
    with whole_team():
        k(A=A, x=x)
        first = k.source
        for _ in range(3):
            k(A=A, x=2 * x)
    assert k.source == first


def test_threads_calling_with_different_shapes_get_their_own_kernels():
    """Each thread's call runs the kernel chosen for its own operands (a Dask-like pool)."""
    rng = np.random.default_rng(12)
    cases = [(rand_csr(rng, n, 200, 4), rng.random((200, m))) for n, m in [(5, 3), (6000, 64)]]
    k = ucf.compile(SPMM, formats={"A": "csr"})
    errors: list[str] = []

    def work(A, B):
        for _ in range(20):
            if not np.allclose(k(A=A, B=B).to_numpy(), A @ B):
                errors.append(f"wrong result for {A.shape} x {B.shape}")

    threads = [threading.Thread(target=work, args=c) for c in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_statistics_key_buckets_nnz_but_not_extents():
    a = Stats({"i": 100, "j": 100}, {"A": 1000})
    assert a.key(2) == Stats({"i": 100, "j": 100}, {"A": 1010}).key(2)
    assert a.key(2) != Stats({"i": 101, "j": 100}, {"A": 1000}).key(2)
    assert a.key(2) != a.key(1)
    uneven = Stats({"i": 100, "j": 100}, {"A": 1000}, {}, {"A": (1.01, 1.05, 1.3)})
    even = Stats(uneven.extents, uneven.nnz)
    assert uneven.key(2) == even.key(2)
    # 1.05 shares out rows that each hold a chunk's work dynamically; 1.3 any rows.
    assert uneven.key(3) != even.key(3)
    assert uneven.key(3)[1:] != uneven.key(4)[1:]


def test_small_calls_keep_the_plan_compiled_before_any_call(monkeypatch):
    monkeypatch.setattr(cpu_model, "REPLAN_WORK", 1 << 20)
    rng = np.random.default_rng(13)
    k = ucf.compile(SPMM, formats={"A": "csr"})
    before = k.source
    for rows, n in ((30, 4), (50, 7)):
        A, B = rand_csr(rng, rows, 20, 3), rng.random((20, n))
        assert np.allclose(k(A=A, B=B).to_numpy(), A @ B)
        assert k.source == before and "too small for a plan of its own" in k.cin, k.cin


@pytest.mark.parametrize("target", TARGETS)
def test_a_filter_sparse_convolution_runs_its_pixels_innermost(target):
    """p, q index no sparse operand: flattened into one pixel variable x over a padded
    input (``ucf.exec.padded_conv``), it moves inside F's loops (m, c, r, s), so the inner loop
    is dense; with n = 1 the parallel loop is m. Checked against a numpy convolution of
    sliding windows."""
    rng = np.random.default_rng(31)
    image = rng.random((1, 6, 10, 9))
    filters = rng.random((16, 6, 3, 3)) * (rng.random((16, 6, 3, 3)) < 0.2)
    k = ucf.compile("O(n,m,p,q) = I(n,c,p+r-1,q+s-1) * F(m,c,r,s)", {"F": "UCCC"}, target=target)
    got = k(I=image, F=ucf.from_numpy(filters, "UCCC"), shapes={"O": (1, 16, 10, 9)})
    padded = np.pad(image, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    np.testing.assert_allclose(got.to_numpy(), np.einsum("ncpqrs,mcrs->nmpq", windows, filters))
    assert "zero-padded planes of 12 rows of 11 columns" in k.cin
    assert "x inside the loops over sparse levels (m, c, r, s)" in k.cin
    assert "loop order n, m, c, r, s, x" in k.cin and "parallel loop m" in k.cin


@pytest.mark.parametrize(
    "stmt, formats",
    [
        ("C(i,j) = A(i,k) * B(k,j)", {"A": "csr"}),  # j is innermost already
        ("T(t,h) = X(t,d) * W(d,h)", {"W": "csr"}),  # h indexes W: t is not moved inside
        ("y(i) = A(i,j) * x(j)", {"A": "csr"}),
    ],
)
def test_loops_over_a_sparse_operand_keep_their_order(stmt, formats):
    k = ucf.compile(stmt, formats)
    assert "inside the loops over sparse levels" not in k.cin


@pytest.mark.parametrize("target", TARGETS)
def test_heavy_rows_are_shared_one_at_a_time_at_a_small_imbalance(target):
    """Block rows of bcsr SpMM each hold a chunk's work: a static split giving one of 2
    threads 1.05x its share already hands them out dynamically, one at a time (evenly
    filled block rows stay static)."""
    rng = np.random.default_rng(11)
    blocks = np.zeros((16, 4), bool)
    blocks[:, 0] = True
    blocks[15, 1] = True  # 17 blocks: 8 and 9 in the two halves of the block rows
    b = rand_dense(rng, (128, 64)).astype(np.float32)
    for pattern, chunks in ((blocks, True), (blocks[:, :1], False)):
        cols = 32 * pattern.shape[1]
        a = np.kron(pattern, np.ones((32, 32))) * rand_dense(rng, (512, cols))
        a = a.astype(np.float32)
        k = ucf.compile(SPMM, formats={"A": "bcsr(32,32)"}, dtype="float32", target=target)
        got = k(A=ucf.from_numpy(a, format="bcsr(32,32)"), B=b[:cols]).to_numpy()
        np.testing.assert_array_equal(got, a @ b[:cols])
        assert any("chunks of 1 " in w for w in chosen(k)) == chunks, k.cin


@pytest.mark.parametrize("fa", ["bcsr(8,8)@qint8:1", "bcsr(8,8)@qint8"])
def test_quantized_blocks_run_in_parallel_where_the_integer_order_is_refused(fa, target):
    """Summing every product of quantized operands inside the output's loops would need
    ``reorder(i_blk, i_in, j, k_blk, k_in)``, which bcsr's storage (k_blk above i_in)
    refuses: the default still runs i_blk in parallel, in the storage order, and the
    result matches numpy on the dequantized operands."""
    rng = np.random.default_rng(9)
    a = np.kron(rng.random((5, 4)) < 0.5, np.ones((8, 8))) * rng.standard_normal((40, 32))
    b = rng.standard_normal((32, 24))
    k = ucf.compile(
        "C(i,j) = A(i,k) * B(k,j)", {"A": fa, "B": "dense@qint8"}, target=target, dtype="float32"
    )
    assert "loop i_blk runs in parallel (CPUThread, NoRaces)" in k.cin
    ta, tb = ucf.quantize(a, format=fa), ucf.quantize(b, format="dense@qint8")
    expected = ta.to_numpy().astype(np.float64) @ tb.to_numpy().astype(np.float64)
    np.testing.assert_allclose(np.asarray(k(A=ta, B=tb)), expected, rtol=1e-5, atol=1e-5)


def test_default_schedule_parallelizes_the_outer_output_loop(target):
    rng = np.random.default_rng(114)
    A = rand_sparse(rng, (59, 37), 0.15, empty_rows=3)
    x = rand_dense(rng, (37,))
    k = ucf.compile(SPMV, formats={"A": "csr"}, target=target)
    claims = [line for line in k.cin.splitlines() if "parallel" in line]
    assert any(names(line, "i") for line in claims), k.cin
    assert np.allclose(dense(k(A=ucf.from_numpy(A, format="csr"), x=x)), A @ x)


@pytest.mark.parametrize("fa", ["dense", "C"])
def test_default_schedule_keeps_outer_reduction_serial(fa, target):
    rng = np.random.default_rng(115)
    a = rand_sparse(rng, (53,), 0.4, empty_rows=0)
    b = rand_dense(rng, (53,))
    formats = {} if fa == "dense" else {"a": fa}
    k = ucf.compile(DOT, formats=formats, target=target)
    assert "runs in parallel" not in k.cin, k.cin
    got = k(**pack({"a": a, "b": b}, formats))
    assert np.asarray(got).shape == ()
    assert np.allclose(np.asarray(got), np.dot(a, b))


def test_empty_schedule_is_serial_and_default_is_parallel():
    expr, fmts = "y(i) = A(i,j) * x(j)", {"A": "csr"}
    assert "in parallel" not in ucf.compile(expr, formats=fmts, schedule="").cin
    assert "loop i runs in parallel" in ucf.compile(expr, formats=fmts).cin
