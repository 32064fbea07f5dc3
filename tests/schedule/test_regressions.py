"""Schedules that once crashed, raced, or were refused for the wrong reason (issue 19).

Each repro either works and matches numpy on both targets, or is refused
with a ScheduleError whose message gives the true reason.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import rand_dense, rand_sparse
from tests.schedule.cases import walk_nodes
from ucf.ir import nodes as ir

SPMV = "y(i) = A(i,j) * x(j)"
SPMM = "C(i,k) = A(i,j) * B(j,k)"
SDDMM = "A(i,j) = B(i,j) * C(i,k) * D(k,j)"
TTV = "A(i,j) = B(i,j,k) * c(k)"


def stores(k: ucf.Kernel, array: str) -> list[ir.Store]:
    found = []

    def walk(stmts):
        for s in stmts:
            if isinstance(s, ir.Store) and s.array.name == array:
                found.append(s)
            for attr in ("body", "then", "orelse", "prologue", "epilogue"):
                walk(getattr(s, attr, []) or [])

    walk(k.llir[-1].body)
    return found


# ----------------------------------------------------------- a loop that uses a workspace


@pytest.mark.parametrize(
    "fmt,schedule",
    [
        ("csc", "precompute(A(i,j)*x(j),i,i,w); parallelize(i,CPUThread,Atomics)"),
        ("csr", "precompute(x(j),j,jw,w); split(i,i0,i1,1); parallelize(i1,CPUThread,NoRaces)"),
    ],
)
def test_parallel_loop_beside_a_shared_workspace(fmt, schedule, target):
    """The loop holds one side of the where only; it was given a private, unfilled copy
    (KeyError: 'w' on the llvm target)."""
    rng = np.random.default_rng(3)
    A = rand_sparse(rng, (40, 30), 0.3)
    x = rand_dense(rng, (30,))
    k = ucf.compile(SPMV, formats={"A": fmt}, schedule=schedule, target=target)
    assert np.allclose(k(A=ucf.from_numpy(A, format=fmt), x=x).to_numpy(), A @ x)


@pytest.mark.parametrize(
    "schedule",
    [
        "precompute(B(i,j,k)*c(k),j,j,w); parallelize(j,CPUThread,NoRaces)",
        "precompute(c(k),k,k,w); parallelize(j,CPUThread,NoRaces)",
        "precompute(c(k),k,k,w); parallelize(k,CPUThread,Atomics)",
    ],
)
def test_ttv_csf_in_another_mode_order_with_a_parallel_workspace(schedule, target):
    rng = np.random.default_rng(5)
    B = rand_sparse(rng, (6, 7, 8), 0.4)
    c = rand_dense(rng, (8,))
    fmt = "CCC:0,2,1"
    k = ucf.compile(TTV, formats={"B": fmt}, schedule=schedule, target=target)
    got = k(B=ucf.from_numpy(B, format=fmt), c=c).to_numpy()
    assert np.allclose(got, np.einsum("ijk,k->ij", B, c))


def test_producer_loop_over_a_reduction_adds_atomically_into_the_workspace(target):
    """Columns of a CSC SpMV in parallel inside the producer: two columns add into the
    same w(i), which raced (a wrong answer about one run in two) until those adds
    became atomic."""
    schedule = "precompute(A(i,j)*x(j),i,i,w); parallelize(j,CPUThread,Atomics)"
    A = sp.random(600, 400, density=0.3, format="csc", random_state=2)
    x = np.random.default_rng(1).random(400)
    k = ucf.compile(SPMV, formats={"A": "csc"}, schedule=schedule, target=target)
    adds = [s for s in stores(k, "w") if s.accumulate]
    assert adds and all(s.atomic for s in adds)
    for _ in range(3):
        assert np.allclose(k(A=A, x=x).to_numpy(), A @ x)


def test_gustavson_with_a_parallel_reduction_loop(target):
    """SpGEMM into a dense output, rows of B in parallel: Atomics works (the adds into
    the row workspace are atomic), Temporary is refused naming the workspace."""
    A = sp.random(30, 20, density=0.3, format="csr", random_state=4)
    B = sp.random(20, 25, density=0.3, format="csr", random_state=5)
    formats = {"A": "csr", "B": "csr"}
    pre = "precompute(A(i,j)*B(j,k),k,k,w); "
    k = ucf.compile(SPMM, formats=formats, schedule=pre + "parallelize(j,CPUThread,Atomics)")
    assert np.allclose(k(A=A, B=B).to_numpy(), (A @ B).toarray())
    with pytest.raises(ucf.ScheduleError, match="add straight into the workspace w"):
        ucf.compile(SPMM, formats=formats, schedule=pre + "parallelize(j,CPUThread,Temporary)")
    sparse = {**formats, "C": "csr"}
    with pytest.raises(ucf.ScheduleError, match="sparse output is appended in order"):
        ucf.compile(SPMM, formats=sparse, schedule=pre + "parallelize(j,CPUThread,Temporary)")


# ----------------------------------------------------------- a tile's guard


def test_tiled_sddmm_guards_the_tail_before_the_coordinate_is_declared(target):
    """``LLIR reads variable k before declaring it``: the tail guard named k, whose
    declaration sat after a load and so inside the guard."""
    rng = np.random.default_rng(7)
    B = rand_sparse(rng, (9, 19), 0.4)
    C, D = rand_dense(rng, (9, 15)), rand_dense(rng, (15, 19))
    k = ucf.compile(
        SDDMM,
        formats={"B": "csr"},
        schedule="split(k,k0,k1,7); split(j,j0,j1,8); reorder(i,j0,k1,k0,j1)",
        target=target,
    )
    got = k(B=ucf.from_numpy(B, format="csr"), C=C, D=D).to_numpy()
    assert np.allclose(got, B * (C @ D))


# ----------------------------------------------------------- running sums under a split


@pytest.mark.parametrize("fmt", [None, "csr", "dcsr"])
@pytest.mark.parametrize("strategy", ["Atomics", "Temporary", "ParallelReduction"])
def test_split_reduction_loop_feeds_the_running_sum_in_parallel(fmt, strategy, target):
    """The running sum is declared outside the split's outer loop; Atomics on dcsr was
    refused as 'a sparse iterator co-iterated with a dense dimension'."""
    rng = np.random.default_rng(11)
    A = rand_sparse(rng, (23, 37), 0.4)
    x = rand_dense(rng, (37,))
    formats = {"A": fmt} if fmt else {}
    schedule = f"split(j,j0,j1,4); parallelize(j1,CPUThread,{strategy})"
    k = ucf.compile(SPMV, formats=formats, schedule=schedule, target=target)
    operand = ucf.from_numpy(A, format=fmt) if fmt else A
    assert np.allclose(k(A=operand, x=x).to_numpy(), A @ x)


def test_ignore_races_on_a_running_sum_names_the_sum():
    with pytest.raises(ucf.ScheduleError) as e:
        ucf.compile(SPMV, schedule="split(j,j0,j1,4); parallelize(j1,CPUThread,IgnoreRaces)")
    message = str(e.value)
    assert "add into the running sum t0" in message
    assert "sparse" not in message


# ----------------------------------------------------------- refusals with the true reason


@pytest.mark.parametrize(
    "schedule",
    [
        "split(i,i0,i1,4); precompute(b(i)*c(i),i1,i1,w)",
        "bound(i,ib,8,MaxExact); split(ib,i0,i1,4); precompute(b(i)*c(i),i1,i1,w)",
    ],
)
def test_tiled_precompute_under_a_scalar_sum_names_the_sum(schedule):
    with pytest.raises(ucf.ScheduleError) as e:
        ucf.compile("s = b(i) * c(i)", schedule=schedule)
    message = str(e.value)
    assert "sums w over i into a scalar" in message
    assert "sparse" not in message


@pytest.mark.parametrize(
    "schedule,unit",
    [
        ("split(j,j0,j1,4); unroll(j1,2); parallelize(j1,CPUVector,NoRaces)", "CPUVector"),
        ("bound(i,ib,5,MaxExact); unroll(ib,2); parallelize(ib,CPUThread,NoRaces)", "CPUThread"),
    ],
)
def test_an_unrolled_loop_cannot_also_be_parallel(schedule, unit, target):
    """gcc takes no ``#pragma GCC unroll`` on an OpenMP loop (a CompileError on target c)."""
    with pytest.raises(ucf.ScheduleError, match="cannot be unrolled too"):
        ucf.compile(TTV, formats={"B": "UCC"}, schedule=schedule, target=target)


def test_threads_inside_vector_lanes_are_refused(target):
    """``omp parallel for`` inside ``omp simd`` is a CompileError on target c."""
    schedule = "parallelize(j,CPUVector,NoRaces); parallelize(k,CPUThread,Atomics)"
    with pytest.raises(ucf.ScheduleError, match="k is inside j, which runs on vector lanes"):
        ucf.compile(TTV, formats={"B": "UUC:1,2,0"}, schedule=schedule, target=target)


# ----------------------------------------------------------- a sparse walk beside a dense loop


@pytest.mark.parametrize(
    "fb,schedule,message",
    [
        ("csr", "fuse(i,j,f)", "would restart at every f"),
        ("csr", "split(j,j0,j1,2); reorder(j1,j0)", "step pB1 from one iteration to the next"),
        ("csr", "split(j,j0,j1,2); reorder(i,j1,j0)", "step pB1 from one iteration to the next"),
        ("dcsr", "split(i,i0,i1,2); reorder(i1,i0)", "step pB0 from one iteration to the next"),
    ],
)
def test_sparse_iterator_beside_a_dense_loop_keeps_its_order(fb, schedule, message, target):
    """A dense A plus a sparse B walks B's positions while the loop visits every
    coordinate; fusing restarted that walk and reordering took the coordinates out of
    order, and both gave wrong sums (found by the schedule fuzzer)."""
    with pytest.raises(ucf.ScheduleError, match=message):
        ucf.compile("C(i,j) = A(i,j) + B(i,j)", formats={"B": fb}, schedule=schedule, target=target)


def test_reorder_of_a_split_running_sum_still_works(target):
    """Running sums do not depend on the order of their terms, so loops feeding one may
    still be interchanged."""
    rng = np.random.default_rng(13)
    A = rand_sparse(rng, (11, 13), 0.5)
    x = rand_dense(rng, (13,))
    k = ucf.compile(SPMV, schedule="split(j,j0,j1,4); reorder(j1,j0)", target=target)
    assert np.allclose(k(A=A, x=x).to_numpy(), A @ x)


# ----------------------------------------------------------- more refusals with the true reason
# (found by reading the fuzzer's commonest refusals next to their cases)


@pytest.mark.parametrize(
    "expr,formats,schedule,reason",
    [
        pytest.param(
            "A(i,j) = B(i,k,l) * C(k,j) * D(l,j)",
            {"B": "CCS:2,1,0"},
            "pos(k, kp, B)",
            "B's level for k is not unique",
            id="pos-non-unique-level",  # was: B's level is dense or not reached
        ),
        pytest.param(
            TTV,
            {"B": "UUC:1,2,0"},
            "precompute(B(i,j,k)*c(k), i, i, w); pos(i, ip, B)",
            "consumer walks the dense workspace w",
            id="pos-precompute-consumer",  # was: a sum with a dense term
        ),
        pytest.param(
            "C(i,j) = A(i,j) + B(i,j)",
            {"A": "UC:1,0", "B": "CU:1,0", "C": "CU:1,0"},
            "divide(i, i0, i1, 8)",
            "i is walked by 2 loops, one per case of a sum",
            id="split-lattice-loops",  # was: the producer and the consumer of the precompute
        ),
    ],
)
def test_refusal_gives_the_true_reason(expr, formats, schedule, reason):
    with pytest.raises(ucf.ScheduleError, match=reason):
        ucf.compile(expr, formats=formats, schedule=schedule)


# ------------------------------------------------------------------ wrong reasons (issues 14, 15)

BIAS = "y(i,j) = A(i,k)*B(k,j) + b(i,j)"


@pytest.mark.parametrize("fmt", ["bcsr(2,2)", "bcsc(2,2)"])
@pytest.mark.parametrize(
    "schedule", ["reorder(i_blk, k_blk, i_in, k_in, j)", "reorder(i_blk, k_blk, i_in, j, k_in)"]
)
def test_a_blocked_product_with_a_bias_names_the_nested_sum(fmt, schedule):
    """Adding b makes the product's sum a nested one, computed whole for each output
    entry, so its loops run inside i_in and j. The message blamed A, saying the
    converted copy the default order reads ('UCUU') stores i_in above k_blk; A stores
    k_blk above i_in."""
    with pytest.raises(ucf.ScheduleError) as e:
        ucf.compile(BIAS, {"A": fmt}, schedule)
    msg = str(e.value)
    assert "k_blk is summed in sum(k_blk, k_in, A(" in msg, msg
    assert "a part of the right-hand side whose value is needed for each j" in msg, msg
    assert "'+='" in msg and "stores" not in msg, msg


def test_the_bias_workaround_the_message_gives_matches_numpy(target):
    rng = np.random.default_rng(40)
    a = rng.standard_normal((7, 5)) * (rng.random((7, 5)) < 0.5)
    B, b = rng.standard_normal((5, 4)), rng.standard_normal((7, 4))
    schedule = "reorder(i_blk, k_blk, i_in, k_in, j)"  # A's own storage order
    k = ucf.compile("y(i,j) += A(i,k)*B(k,j)", {"A": "bcsr(2,2)"}, schedule, target=target)
    assert "converted" not in k.cin
    y = k(A=ucf.from_numpy(a, format="bcsr(2,2)"), B=B, out=ucf.from_numpy(b.copy()))
    np.testing.assert_allclose(y.to_numpy(), a @ B + b, rtol=1e-13)


def test_a_bias_says_why_a_blocked_operand_is_converted_and_dismantle_cannot_follow_it():
    A = ucf.from_numpy(np.kron(np.eye(3), np.ones((2, 2))), format="bcsr(2,2)")
    k = ucf.compile(BIAS, {"A": "bcsr(2,2)"})
    assert "no loop order follows it (A stores k_blk above i_in, but k_blk is summed" in k.cin
    with pytest.raises(ucf.ScheduleError, match=r"dismantle\(i_blk\): .*A stores k_blk above i_in"):
        ucf.compile(BIAS, {"A": "bcsr(2,2)"}, "dismantle(i_blk)", static={"A": A})


SPGEMM = "C(i,j) = A(i,k)*B(k,j)"
CSR3 = {"A": "csr", "B": "csr", "C": "csr"}


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ("reorder(i,k,j)", "reduction variable k would enclose output variable j, which a sparse"),
        ("reorder(k,i,j)", r"operand A \('csr'\) stores i above k"),
        ("reorder(j,k,i)", r"operand A \('csr'\) stores i above k"),
        ("reorder(j,i,k)", r"output C \('UC'\) stores i above j"),
    ],
)
def test_spgemm_reorders_are_refused_naming_the_formats_as_written(schedule, message):
    """The default all-CSR SpGEMM without a workspace reads B converted to 'UC:1,0' (its
    order is i, j, k); the checker named that copy as if B were stored so, and refused
    i, k, j, which B's own storage follows, for B instead of for the output."""
    with pytest.raises(ucf.ScheduleError, match=message) as e:
        ucf.compile(SPGEMM, CSR3, schedule)
    assert "UC:1,0" not in str(e.value)


def test_spgemm_in_the_converted_order_still_matches_scipy(target):
    rng = np.random.default_rng(41)
    A = sp.random(9, 7, density=0.3, random_state=rng, format="csr")
    B = sp.random(7, 8, density=0.3, random_state=rng, format="csr")
    k = ucf.compile(SPGEMM, CSR3, "reorder(i,j,k)", target=target)
    with pytest.warns(ucf.ConversionWarning):
        got = k(A=A, B=B).to_scipy()
    np.testing.assert_allclose(got.toarray(), (A @ B).toarray(), rtol=1e-13)


# ---------------------------------------------------------------- regressions
def test_dense_fuse_matches_numpy(target):
    rng = np.random.default_rng(3)
    B, C = rng.random((7, 5)), rng.random((7, 5))
    k = ucf.compile(
        "A(i,j) = B(i,j) * C(i,j)",
        schedule="fuse(i,j,f); split(f,f0,f1,4); parallelize(f0,CPUThread,NoRaces)",
        target=target,
    )
    assert np.allclose(k(B=B, C=C).to_numpy(), B * C)


def test_gustavson_keeps_csr_operands_and_sorts_a_row_workspace():
    k = ucf.compile(
        "C(i,k) = A(i,j) * B(j,k)",
        formats={"A": "csr", "B": "csr", "C": "csr"},
        schedule="precompute(A(i,j)*B(j,k),k,k,w)",
    )
    assert "converted" not in k.cin
    assert "loop order i, j, k" in k.cin
    calls = [s for s in walk_nodes(k.llir[-1].body) if isinstance(s, ir.Call)]
    assert [c.name for c in calls] == ["ucf_sort_i64"]


def test_parallel_loop_inside_a_precompute_keeps_the_shared_workspace(target):
    A = sp.random(30, 20, density=0.3, format="csr", random_state=2)
    x = np.random.default_rng(2).random(20)
    k = ucf.compile(
        "y(i) = A(i,j) * x(j)",
        formats={"A": "csr"},
        schedule="precompute(A(i,j)*x(j),i,iw,w); parallelize(iw,CPUThread,NoRaces)",
        target=target,
    )
    assert np.allclose(k(A=A, x=x).to_numpy(), A @ x)


def test_vector_atomics_is_refused_with_the_alternatives():
    with pytest.raises(ucf.ScheduleError, match="CPUVector takes NoRaces"):
        ucf.compile(
            "y(i) = A(i,j) * x(j)",
            formats={"A": "csr"},
            schedule="parallelize(j,CPUVector,Atomics)",
        )


def test_fuse_of_a_sparse_loop_suggests_pos():
    with pytest.raises(ucf.ScheduleError, match=r"add pos\(f, fpos, T\)"):
        ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, schedule="fuse(i,j,f)")
