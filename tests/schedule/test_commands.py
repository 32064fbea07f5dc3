"""The scheduling language, command by command, on both targets.

Every kernel case is checked twice: against numpy/scipy (the expected value
never comes from ucf) and against the same statement compiled without a
schedule, since a schedule must change the algorithm and never the result.
Operands are small integer-valued arrays with fixed seeds, so results are
exact; the comparisons still use ``np.allclose``.

The statements and schedules follow the TACO scheduling papers: SpMV, SpMM,
SDDMM, TTV, MTTKRP, Gustavson SpGEMM, a scalar reduction, bounded loops with
tails, tiled element-wise products, unrolling, reorder, parallel loops and splits.
Random legal schedules are in test_fuzz.py, illegal ones in test_refusals.py, the
text and the fluent chain in test_text.py.
"""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import arrival_operands, nonzero_coords, rand_dense, rand_sparse, stored_coords
from tests.schedule.cases import (
    DOT,
    MTTKRP,
    PAR_I,
    SDDMM,
    SPMM,
    SPMV,
    TTV,
    assert_sorted_csr,
    check,
    dense,
    walk_nodes,
)
from ucf.ir import nodes as ir

SPMV_SCHEDULES = {
    "split-reorder-parallel": (
        "split(i,i0,i1,16); reorder(i0,i1,j); parallelize(i0,CPUThread,NoRaces)"
    ),
    "fuse-pos-atomics": (
        "fuse(i,j,k); pos(k,kpos,A); split(kpos,kpos0,kpos1,16); "
        "parallelize(kpos0,CPUThread,Atomics)"
    ),
    "fuse-pos-atomics-fluent": ucf.Schedule()
    .fuse("i", "j", "k")
    .pos("k", "kpos", "A")
    .split("kpos", "kpos0", "kpos1", 16)
    .parallelize("kpos0", "CPUThread", "Atomics"),
}


@pytest.mark.parametrize("schedule", list(SPMV_SCHEDULES.values()), ids=list(SPMV_SCHEDULES))
def test_spmv(schedule, target):
    rng = np.random.default_rng(101)
    A = rand_sparse(rng, (57, 43), 0.15, empty_rows=3)
    x = rand_dense(rng, (43,))
    check(SPMV, {"A": "csr"}, schedule, target, {"A": A, "x": x}, A @ x)


def test_spmm(target):
    rng = np.random.default_rng(102)
    A = rand_sparse(rng, (53, 41), 0.15, empty_rows=3)
    B = rand_dense(rng, (41, 128))
    schedule = (
        "split(i,i0,i1,16); pos(j,jpos,A); split(jpos,jpos0,jpos1,8); "
        "reorder(i0,i1,jpos0,k,jpos1); parallelize(i0,CPUThread,NoRaces); "
        "parallelize(k,CPUVector,IgnoreRaces)"
    )
    check(SPMM, {"A": "csr"}, schedule, target, {"A": A, "B": B}, A @ B)


def test_sddmm(target):
    rng = np.random.default_rng(103)
    B = rand_sparse(rng, (47, 61), 0.12, empty_rows=3)
    C = rand_dense(rng, (47, 13))
    D = rand_dense(rng, (13, 61))
    schedule = (
        "split(i,i0,i1,16); pos(k,kpos,B); split(kpos,kpos0,kpos1,8); "
        "reorder(i0,i1,kpos0,j,kpos1); parallelize(i0,CPUThread,NoRaces); "
        "parallelize(kpos1,CPUVector,ParallelReduction)"
    )
    check(SDDMM, {"B": "csr"}, schedule, target, {"B": B, "C": C, "D": D}, B * (C @ D))


def _ttv_operands(seed: int):
    rng = np.random.default_rng(seed)
    B = rand_sparse(rng, (41, 23, 9), 0.1, empty_rows=3)
    B[:, 4, :] = 0  # an empty (i, 4, :) slice in every row
    c = rand_dense(rng, (9,))
    return B, c


def test_ttv_fused_position_chunks(target):
    B, c = _ttv_operands(104)
    schedule = (
        "fuse(i,j,f); pos(f,fpos,B); split(fpos,chunk,fpos2,16); "
        "reorder(chunk,fpos2,k); parallelize(chunk,CPUThread,NoRaces)"
    )
    check(TTV, {"B": "csf"}, schedule, target, {"B": B, "c": c}, np.einsum("ijk,k->ij", B, c))


def test_ttv_sparse_output_parallel(target):
    B, c = _ttv_operands(105)
    formats = {"A": "csr", "B": "csf"}
    got, ref, _ = check(TTV, formats, PAR_I, target, {"B": B, "c": c}, np.einsum("ijk,k->ij", B, c))
    implied = nonzero_coords(np.any(B != 0, axis=2))
    assert stored_coords(got) == implied
    assert stored_coords(ref) == implied
    assert_sorted_csr(got.to_scipy())


MTTKRP_SCHEDULES = {
    "workspace-BC": (
        "split(i,i1,i2,16); reorder(i1,i2,k,l,j); precompute(B(i,k,l)*C(k,j),j,j,w); "
        "parallelize(i1,CPUThread,NoRaces)"
    ),
    "workspace-BD-sums-l": (
        "split(i,i1,i2,16); reorder(i1,i2,k,l,j); precompute(B(i,k,l)*D(l,j),j,j,w); "
        "parallelize(i1,CPUThread,NoRaces)"
    ),
}


@pytest.mark.parametrize("schedule", list(MTTKRP_SCHEDULES.values()), ids=list(MTTKRP_SCHEDULES))
def test_mttkrp_precompute(schedule, target):
    rng = np.random.default_rng(106)
    B = rand_sparse(rng, (43, 11, 9), 0.12, empty_rows=3)
    C = rand_dense(rng, (11, 7))
    D = rand_dense(rng, (9, 7))
    expected = np.einsum("ikl,kj,lj->ij", B, C, D)
    check(MTTKRP, {"B": "csf"}, schedule, target, {"B": B, "C": C, "D": D}, expected)


GUSTAVSON = "precompute(A(i,j)*B(j,k),k,k,w)"


# The unscheduled kernel writes C in order (i, k, j) and repacks B to follow it.
@pytest.mark.filterwarnings("ignore::ucf.ConversionWarning")
@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
@pytest.mark.parametrize("fa,fb", list(itertools.product(["csr", "dcsr"], repeat=2)))
def test_gustavson_spgemm(fa, fb, parallel, target):
    rng = np.random.default_rng(107)
    A = rand_sparse(rng, (45, 38), 0.08, empty_rows=4)
    B = rand_sparse(rng, (38, 52), 0.08, empty_rows=4)
    A[:, 5] = 0  # an empty column of A (B's row 5 then never contributes)
    B[:, 7] = 0  # an empty column of B, hence of C
    schedule = GUSTAVSON + ("; " + PAR_I if parallel else "")
    formats = {"A": fa, "B": fb, "C": "csr"}
    got, ref, _ = check(SPMM, formats, schedule, target, {"A": A, "B": B}, A @ B)

    structural = (A != 0).astype(np.int64) @ (B != 0).astype(np.int64) > 0
    implied = nonzero_coords(structural)
    assert not structural[:, 7].any() and not structural.any(axis=1).all()
    assert stored_coords(got) == implied
    assert stored_coords(ref) == implied
    S = got.to_scipy()
    assert S.shape == (45, 52)
    assert_sorted_csr(S)
    assert np.allclose(S.toarray(), A @ B)


def _long_rows(rng, rows: int, cols: int, lengths: list[int]) -> sp.csr_matrix:
    """Rows with the given numbers of entries at random distinct columns."""
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = np.concatenate([rng.choice(cols, n, replace=False) for n in lengths])
    data = rng.integers(1, 5, indptr[-1]).astype(np.float64)
    return sp.csr_matrix((data, indices, indptr), shape=(rows, cols))


# Rows of C longer than 32 entries take the radix sort: extents with 6 to 17 key bits give
# one, two and three digit passes (an odd count ends with a copy back), and the full row
# (every column present) is the longest list the workspace can hold.
@pytest.mark.parametrize("cols", [40, 256, 257, 5000, 70000])
def test_gustavson_long_rows_are_sorted(cols, target):
    rng = np.random.default_rng(cols)
    lengths = [0, 1, 33, min(cols, 300), cols, min(cols, 700), 5]
    a = np.eye(len(lengths)) * 3.0
    a[2, 3] = 2.0  # two rows of B merge into row 2 of C
    A = sp.csr_matrix(a)
    B = _long_rows(rng, len(lengths), cols, lengths)
    for parallel in (False, True):
        schedule = GUSTAVSON + ("; " + PAR_I if parallel else "")
        k = ucf.compile(
            SPMM, formats={"A": "csr", "B": "csr", "C": "csr"}, schedule=schedule, target=target
        )
        S = k(A=A, B=B).to_scipy()
        assert_sorted_csr(S)
        assert np.array_equal(S.toarray(), (A @ B).toarray())


def test_gustavson_sorts_rows_whatever_order_they_arrive_in(target):
    """Each row of C reaches the workspace in an order that takes one path of the sort
    (``conftest.arrival_operands``); it comes out sorted."""
    A, B = arrival_operands(np.random.default_rng(11), 5000)
    k = ucf.compile(
        SPMM, formats={"A": "csr", "B": "csr", "C": "csr"}, schedule=GUSTAVSON, target=target
    )
    S = k(A=A, B=B).to_scipy()
    assert_sorted_csr(S)
    assert np.array_equal(S.toarray(), (A @ B).toarray())


def test_listed_workspace_survives_the_epoch_wrap(monkeypatch, tmp_path):
    """Each row starts a new epoch; at the wrap the flags are cleared and numbering restarts.

    A wrap every 3 rows (instead of every 2**31) is a fresh plan, hence its own cache.
    """
    from ucf.lower import workspaces

    monkeypatch.setattr(workspaces, "EPOCH_WRAP", 3)
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(5)
    A = sp.random(40, 30, density=0.2, format="csr", random_state=rng)
    B = sp.random(30, 50, density=0.2, format="csr", random_state=rng)
    for target in ("llvm", "c"):
        k = ucf.compile(
            SPMM, formats={"A": "csr", "B": "csr", "C": "csr"}, schedule=GUSTAVSON, target=target
        )
        assert any(c.value == 3 for c in _consts(k.llir[-1].body))
        S = k(A=A, B=B).to_scipy()
        assert_sorted_csr(S)
        assert np.allclose(S.toarray(), (A @ B).toarray())
        assert stored_coords(k(A=A, B=B)) == nonzero_coords(((A != 0) @ (B != 0)).toarray())


def _consts(stmts):
    """Every constant in the statements' expressions."""
    for s in walk_nodes(stmts):
        for v in vars(s).values():
            yield from _expr_consts(v)


def _expr_consts(e):
    if isinstance(e, ir.Const):
        yield e
    elif isinstance(e, ir.Expr):
        for v in vars(e).values():
            yield from _expr_consts(v)


@pytest.mark.parametrize("strategy", ["Atomics", "Temporary", "ParallelReduction"])
@pytest.mark.parametrize("fa", ["dense", "C"])
def test_parallel_scalar_reduction(fa, strategy, target):
    rng = np.random.default_rng(108)
    a = rand_sparse(rng, (67,), 0.3, empty_rows=0)
    b = rand_dense(rng, (67,))
    formats = {} if fa == "dense" else {"a": fa}
    schedule = f"split(i,i0,i1,8); parallelize(i0,CPUThread,{strategy})"
    got, _, _ = check(DOT, formats, schedule, target, {"a": a, "b": b}, np.dot(a, b))
    assert np.asarray(got).shape == ()


EW1 = "a(i) = b(i) * c(i)"


def _bounded(n: int) -> str:
    return f"bound(i,ib,{n},MaxExact); split(ib,i0,i1,4); precompute(b(i)*c(i),i1,i1,w)"


@pytest.mark.parametrize("n", [16, 17])
def test_bound_split_precompute(n, target):
    rng = np.random.default_rng(109 + n)
    b = rand_dense(rng, (n,))
    c = rand_dense(rng, (n,))
    check(EW1, {}, _bounded(n), target, {"b": b, "c": c}, b * c)


def test_bound_rejects_a_larger_extent(target):
    rng = np.random.default_rng(110)
    k = ucf.compile(EW1, schedule=_bounded(16), target=target)
    b16, c16 = rand_dense(rng, (16,)), rand_dense(rng, (16,))
    assert np.allclose(dense(k(b=b16, c=c16)), b16 * c16)
    b17, c17 = rand_dense(rng, (17,)), rand_dense(rng, (17,))
    with pytest.raises(ucf.UcfError):
        k(b=b17, c=c17)


# The sparse output's assemble pass stops at its last compressed level, so the loop over
# the dense trailing level k exists only in the compute pass; commands on it (and on the
# loops they derive) apply there and are skipped in the assemble pass.
@pytest.mark.parametrize(
    "schedule",
    [
        "bound(k,kb,8,MaxExact)",
        "bound(k,kb,8,MaxExact); unroll(kb,8)",
        "split(k,k0,k1,3)",
        "split(k,k0,k1,4); parallelize(k1,CPUVector,IgnoreRaces)",
        "parallelize(k,CPUVector,NoRaces)",
        "split(i,i0,i1,2); parallelize(i0,CPUThread,NoRaces); bound(k,kb,8,MaxExact)",
    ],
)
def test_commands_below_the_last_appended_level(schedule, target):
    rng = np.random.default_rng(111)
    B = rand_sparse(rng, (7, 6), 0.4, empty_rows=2)
    C = rand_dense(rng, (6, 8))
    expected = np.einsum("ij,jk->ijk", B, C)
    got, _, k = check(
        "A(i,j,k) = B(i,j) * C(j,k)",
        {"A": "UCU", "B": "UC"},
        schedule,
        target,
        {"B": B, "C": C},
        expected,
    )
    assert stored_coords(got) == {(i, j, kk) for i, j in nonzero_coords(B) for kk in range(8)}


TILE_PERMS = list(itertools.permutations(["i0", "i1", "j0", "j1"]))


@pytest.mark.parametrize("perm", TILE_PERMS, ids=["".join(p) for p in TILE_PERMS])
def test_tiled_elementwise_every_order(perm, target):
    rng = np.random.default_rng(111)
    B = rand_dense(rng, (10, 7))
    C = rand_dense(rng, (10, 7))
    schedule = f"split(i,i0,i1,4); split(j,j0,j1,4); reorder({','.join(perm)})"
    check("A(i,j) = B(i,j) * C(i,j)", {}, schedule, target, {"B": B, "C": C}, B * C)


def test_unroll_bounded_loop(target):
    rng = np.random.default_rng(112)
    A = rand_dense(rng, (45, 8))
    x = rand_dense(rng, (8,))
    check(SPMV, {}, "bound(j,jb,8,MaxExact); unroll(jb,4)", target, {"A": A, "x": x}, A @ x)


@pytest.mark.parametrize("fa", ["dense", "csr"])
def test_divide_parallel(fa, target):
    rng = np.random.default_rng(113)
    A = rand_sparse(rng, (61, 29), 0.2, empty_rows=3)
    x = rand_dense(rng, (29,))
    formats = {} if fa == "dense" else {"A": fa}
    schedule = "divide(i,i0,i1,3); parallelize(i0,CPUThread,NoRaces)"
    check(SPMV, formats, schedule, target, {"A": A, "x": x}, A @ x)


#: TACO's scheduleSpMMGPU (test/tests-scheduling-eval.cpp, 8 nonzeros per warp and 256
#: threads per block) without its GPU parallelize commands: a bound on the outer loop of
#: a split, and column loops moved outside the nonzeros of a fused pos loop.
TACO_SPMM_GPU_LOOPS = (
    "reorder(i,j,k); fuse(i,j,f); pos(f,fpos,A); split(fpos,block,fpos1,64); "
    "split(fpos1,warp,nnz,8); split(k,dense_val_unbounded,thread,32); "
    "reorder(block,warp,thread,dense_val_unbounded,nnz); "
    "bound(dense_val_unbounded,dense_val,4,MaxExact)"
)


def _spmm_rows(rng, cols: int = 38) -> np.ndarray:
    """Empty rows, a dense row and short rows: the cases a row catch-up can get wrong."""
    A = rand_sparse(rng, (45, cols), 0.15, empty_rows=4)
    A[7] = rand_dense(rng, (cols,))
    return A


@pytest.mark.parametrize("columns", [97, 128])
def test_taco_gpu_spmm_loops(columns, target):
    rng = np.random.default_rng(115 + columns)
    A = _spmm_rows(rng)
    B = rand_dense(rng, (38, columns))
    check(SPMM, {"A": "csr"}, TACO_SPMM_GPU_LOOPS, target, {"A": A, "B": B}, A @ B)


@pytest.mark.parametrize(
    "schedule",
    [
        "fuse(i,j,f); pos(f,fpos,A); reorder(k,fpos)",
        "fuse(i,j,f); pos(f,fpos,A); split(fpos,b,nz,8); reorder(b,k,nz)",
        "fuse(i,j,f); pos(f,fpos,A); split(fpos,b,nz,8); reorder(b,k,nz); "
        "parallelize(b,CPUThread,Atomics)",
        "fuse(i,j,f); pos(f,fpos,A); split(fpos,b,nz,8); split(k,k0,k1,4); reorder(b,k1,nz,k0)",
    ],
)
def test_loops_move_outside_a_fused_pos_loop(schedule, target):
    """Each run of the moved loop restarts the nonzeros with its own copy of the row."""
    rng = np.random.default_rng(116)
    A = _spmm_rows(rng)
    B = rand_dense(rng, (38, 9))
    check(SPMM, {"A": "csr"}, schedule, target, {"A": A, "B": B}, A @ B)


@pytest.mark.parametrize(
    "schedule,good,bad,formula",
    [
        (TACO_SPMM_GPU_LOOPS, [97, 128], [96, 129], "ceil(k / 32)"),
        (
            "split(k,k0,k1,4); split(k0,k00,k01,2); bound(k00,kb,3,MaxExact); unroll(kb,3)",
            [17, 24],
            [16, 25],
            "ceil(k / 8)",
        ),
    ],
    ids=["taco", "split-of-split"],
)
def test_bound_on_a_split_checks_each_call(schedule, good, bad, formula, target):
    rng = np.random.default_rng(117)
    A = _spmm_rows(rng)
    k = ucf.compile(SPMM, formats={"A": "csr"}, schedule=schedule, target=target)
    for n in good:
        B = rand_dense(rng, (38, n))
        assert np.allclose(dense(k(A=A, B=B)), A @ B), n
    for n in bad:
        with pytest.raises(ucf.ShapeError) as e:
            k(A=A, B=rand_dense(rng, (38, n)))
        assert formula in str(e.value) and f"extent {n} of k" in str(e.value)


def test_bound_on_a_split_of_a_narrowed_window(target):
    """Where an affine index narrows the split loop, the bounded loop's extra runs are empty."""
    P = np.arange(1.0, 13.0)
    G = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    expected = np.array(
        [sum(P[x + r - 2] * G[r] for r in range(5) if 0 <= x + r - 2 < 12) for x in range(12)]
    )
    schedule = "reorder(x,k); split(k,k0,k1,2); bound(k0,kb,3,MaxExact)"
    check("O(x) = P(x+k-2) * G(k)", {}, schedule, target, {"P": P, "G": G}, expected)


@pytest.mark.parametrize("order", list(itertools.permutations("ijk")))
def test_reorder_dense_product_every_order(order, target):
    rng = np.random.default_rng(7)
    A = rng.random((3, 4, 5))
    B = rng.random((3, 4, 5))
    expr = "C(i,j,k) = A(i,j,k) * B(i,j,k) + A(i,j,k)"
    k = ucf.compile(expr, schedule=f"reorder({', '.join(order)})", target=target)
    assert "loop order " + ", ".join(order) in k.cin
    assert np.allclose(k(A=A, B=B).to_numpy(), A * B + A)


@pytest.mark.parametrize("fa", ["UC:1,0", "CC:1,0", "UU"])
def test_reorder_follows_csc_storage(fa, target):
    A = sp.random(12, 9, density=0.3, format="csr", random_state=4)
    x = np.linspace(-1, 1, 9)
    k = ucf.compile(
        "y(i) = A(i,j) * x(j)", formats={"A": fa}, schedule="reorder(j, i)", target=target
    )
    assert np.allclose(k(A=ucf.from_scipy(A, format=fa), x=x).to_numpy(), A @ x)


def test_spmm_inner_product_order(target):
    A = sp.random(20, 15, density=0.2, format="csr", random_state=5)
    B = np.random.default_rng(1).random((15, 6))
    k = ucf.compile(
        "C(i,k) = A(i,j) * B(j,k)",
        formats={"A": "csr"},
        schedule=ucf.Schedule().reorder("i", "k", "j"),
        target=target,
    )
    assert np.allclose(k(A=A, B=B).to_numpy(), A @ B)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("fa", ["csr", "dcsr", "UU"])
def test_parallel_spmv_matches_serial_and_scipy(fa, threads, target):
    A = sp.random(257, 120, density=0.05, format="lil", random_state=8)
    A[3, :] = 0  # an empty row
    A = A.tocsr()
    A.eliminate_zeros()
    x = np.random.default_rng(2).random(120)
    ucf.set_num_threads(threads)
    try:
        serial = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": fa}, target=target)
        par = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": fa}, schedule=PAR_I, target=target)
        y = par(A=A, x=x).to_numpy()
    finally:
        ucf.set_num_threads(2)
    assert "in parallel" in par.cin
    assert np.array_equal(y, serial(A=A, x=x).to_numpy())
    assert np.allclose(y, A @ x)


def test_parallel_spmm_and_csf_ttv(target):
    rng = np.random.default_rng(3)
    A = sp.random(100, 60, density=0.1, format="csr", random_state=9)
    B = rng.random((60, 33))
    k = ucf.compile("C(i,k) = A(i,j) * B(j,k)", formats={"A": "csr"}, schedule=PAR_I, target=target)
    assert np.allclose(k(A=A, B=B).to_numpy(), A @ B)
    T = rng.random((9, 7, 5)) * (rng.random((9, 7, 5)) < 0.3)
    c = rng.random(5)
    k = ucf.compile("A(i,j) = B(i,j,k) * c(k)", formats={"B": "csf"}, schedule=PAR_I, target=target)
    assert np.allclose(
        k(B=ucf.from_numpy(T, format="csf"), c=c).to_numpy(), np.einsum("ijk,k->ij", T, c)
    )


def test_parallel_c_source_has_the_pragma():
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, schedule=PAR_I, target="llvm")
    assert "omp parallel for" in k.c_source
    assert "ucf_parallel" in k.source  # libgomp's GOMP_parallel behind ucf.codegen.llvm_team


def test_parallel_body_keeps_the_arrays_no_alias():
    """The outlined parallel body gets the arrays as noalias arguments, and once inlined
    into the libgomp entry they survive as scoped no-alias metadata on its accesses."""
    from ucf.toolchain import jit

    k = ucf.compile(
        "C(i,k) = A(i,j) * B(j,k)",
        formats={"A": "csr"},
        schedule="bound(k,kb,8,MaxExact); split(i,i0,i1,4); parallelize(i0,CPUThread,NoRaces)",
    )
    body = k.source[k.source.index('define internal void @"kernel.omp1.body"(') :].split("\n", 1)[0]
    restricted = re.findall(r'noalias %"(\w+)"', body)
    assert sorted(restricted) == ["A1_crd", "A1_pos", "A_vals", "B_vals", "C_vals"]
    entry = jit.optimized_ir(k.source).split("@kernel.omp1(")[1].split("\ndefine ")[0]
    assert "!alias.scope" in entry and "!noalias" in entry
    A = sp.random(30, 20, density=0.3, format="csr", random_state=4)
    B = np.random.default_rng(4).random((20, 8))
    assert np.allclose(k(A=A, B=B).to_numpy(), A @ B)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 33])
@pytest.mark.parametrize(
    "schedule",
    [
        "split(i, i0, i1, 16); reorder(i0, i1, j); parallelize(i0, CPUThread, NoRaces)",
        "split(i, i0, i1, 4); parallelize(i1, CPUThread, NoRaces)",
        "divide(i, i0, i1, 3); parallelize(i0, CPUThread, NoRaces)",
        "divide(i, i0, i1, 40)",
        "split(j, j0, j1, 4)",
        "split(i, i0, i1, 8); split(j, j0, j1, 3)",
    ],
)
def test_split_and_divide_with_tails(n, schedule, target):
    A = sp.random(n, 11, density=0.3, format="csr", random_state=n)
    x = np.random.default_rng(n).random(11)
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, schedule=schedule, target=target)
    assert "inner loop of" in k.cin
    assert np.allclose(k(A=A, x=x).to_numpy(), A @ x)


def test_split_dense_and_csf_loops(target):
    rng = np.random.default_rng(11)
    A = rng.random((17, 9))
    B = rng.random((9, 5))
    k = ucf.compile(
        "C(i,k) = A(i,j) * B(j,k)",
        schedule="split(k, k0, k1, 2); split(i, i0, i1, 4)",
        target=target,
    )
    assert np.allclose(k(A=A, B=B).to_numpy(), A @ B)
    T = rng.random((9, 7, 5)) * (rng.random((9, 7, 5)) < 0.3)
    c = rng.random(5)
    k = ucf.compile(
        "A(i,j) = B(i,j,k) * c(k)",
        formats={"B": "csf"},
        schedule="split(j, j0, j1, 2); parallelize(j0, CPUThread, NoRaces)",
        target=target,
    )
    assert np.allclose(
        k(B=ucf.from_numpy(T, format="csf"), c=c).to_numpy(), np.einsum("ijk,k->ij", T, c)
    )
