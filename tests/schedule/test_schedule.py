"""Schedules: parsing, the fluent chain, reorder against numpy, and clear refusals."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from ucf.schedule import parse_schedule


def test_every_command_parses():
    text = """reorder(i, j, k); split(i, i0, i1, 16)
    divide(j, j0, j1, 4); fuse(i, j, f); pos(f, fpos, A); bound(i, ib, 17, MaxExact)
    unroll(i1, 4); precompute(B(i,k,l) * C(k,j), j, jw, w)
    parallelize(i0, CPUThread, NoRaces); parallelize(jpos1, GPUGroup, 8, Segment)"""
    cmds = parse_schedule(text)
    assert [c.name for c in cmds] == [
        "reorder",
        "split",
        "divide",
        "fuse",
        "pos",
        "bound",
        "unroll",
        "precompute",
        "parallelize",
        "parallelize",
    ]
    assert cmds[7].args[0] == "B(i,k,l) * C(k,j)"
    assert cmds[-1].args == ("jpos1", "GPUGroup", "8", "Segment")


def test_fluent_chain_prints_the_same_commands():
    s = ucf.Schedule().split("i", "i0", "i1", 16).reorder("i0", "i1", "j")
    s = s.parallelize("i0", "CPUThread", "NoRaces")
    assert str(s) == "split(i, i0, i1, 16); reorder(i0, i1, j); parallelize(i0, CPUThread, NoRaces)"
    assert [str(c) for c in parse_schedule(str(s))] == [str(c) for c in s.commands]


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


@pytest.mark.parametrize(
    "schedule,message",
    [
        ("reoder(i, j)", "did you mean 'reorder'"),
        ("reorder(i, jj)", "did you mean 'j'"),
        ("reorder(j, i)", "stores i above j"),
        ("reorder(i, i)", "repeated"),
        ("split(i, i0, i1)", "takes 4 arguments"),
        ("pos(i, ipos, A)", r"dense \(U\) level"),
    ],
)
def test_bad_schedules(schedule, message):
    with pytest.raises(ucf.ScheduleError, match=message):
        ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, schedule=schedule)


def test_schedule_syntax_error_has_caret():
    with pytest.raises(ucf.ParseError) as e:
        ucf.compile("y(i) = A(i,j) * x(j)", schedule="reorder(i,, j)")
    assert "^" in str(e.value) and e.value.column == 11


def test_sparse_output_refuses_reduction_outside():
    with pytest.raises(ucf.ScheduleError, match="reduction variable j"):
        ucf.compile(
            "C(i,k) = A(i,j) * B(j,k)", formats={"A": "csr", "C": "csr"}, schedule="reorder(j, k)"
        )


PAR = "parallelize(i, CPUThread, NoRaces)"


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
        par = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": fa}, schedule=PAR, target=target)
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
    k = ucf.compile("C(i,k) = A(i,j) * B(j,k)", formats={"A": "csr"}, schedule=PAR, target=target)
    assert np.allclose(k(A=A, B=B).to_numpy(), A @ B)
    T = rng.random((9, 7, 5)) * (rng.random((9, 7, 5)) < 0.3)
    c = rng.random(5)
    k = ucf.compile("A(i,j) = B(i,j,k) * c(k)", formats={"B": "csf"}, schedule=PAR, target=target)
    assert np.allclose(
        k(B=ucf.from_numpy(T, format="csf"), c=c).to_numpy(), np.einsum("ijk,k->ij", T, c)
    )


def test_parallel_c_source_has_the_pragma():
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, schedule=PAR, target="llvm")
    assert "omp parallel for" in k.c_source
    assert "GOMP_parallel" in k.source


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


@pytest.mark.parametrize(
    "expr,formats,schedule,message",
    [
        (
            "y(i) = A(i,j) * x(j)",
            {"A": "csr"},
            "parallelize(j, CPUThread, NoRaces)",
            "reduction variable",
        ),
        (
            "y(i) = A(i,j) * x(j)",
            {"A": "csr"},
            "parallelize(i, CPUThred, NoRaces)",
            "did you mean 'CPUThread'",
        ),
        (
            "y(i) = A(i,j) * x(j)",
            {"A": "csr"},
            "parallelize(q, CPUThread, NoRaces)",
            "unknown index variable 'q'",
        ),
        ("y(i) = A(i) + B(i)", {"A": "C", "B": "C"}, PAR, "co-iterated by a while loop"),
        ("y(i) = A(i) + d(i)", {"A": "C"}, PAR, "carries"),
        ("C(i,j) = A(i,j) + B(i,j)", {"A": "csr", "B": "csr", "C": "dcsr"}, PAR, "sparse output"),
        (
            "y(i) = A(i,j) * x(j)",
            {"A": "csr"},
            "parallelize(i, GPUBlock, NoRaces)",
            "GPU units need target 'cuda'",
        ),
    ],
)
def test_illegal_parallelize(expr, formats, schedule, message):
    with pytest.raises(ucf.ScheduleError, match=message):
        ucf.compile(expr, formats=formats, schedule=schedule)


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


@pytest.mark.parametrize(
    "schedule,message",
    [
        ("split(i, i0, i1, 4); fuse(i1, i0, f)", "must be the loop directly inside"),
        ("split(i, i0, i1, 0)", "positive integer"),
        ("split(i, j, i1, 4)", "already a loop variable"),
        ("split(q, i0, i1, 4)", "unknown index variable 'q'"),
        ("split(i, i0, i1, 4); parallelize(i, CPUThread, NoRaces)", "unknown index variable 'i'"),
    ],
)
def test_bad_splits(schedule, message):
    with pytest.raises(ucf.ScheduleError, match=message):
        ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, schedule=schedule)


def test_parallel_coiteration_is_refused():
    """A co-iteration is split in coordinate space (tests/lower/test_coordinate_split.py), but
    the while loop itself cannot run in parallel."""
    with pytest.raises(ucf.ScheduleError, match="while loop"):
        ucf.compile(
            "y(i) = A(i) + B(i)",
            formats={"A": "C", "B": "C"},
            schedule="parallelize(i, CPUThread, NoRaces)",
        )


@pytest.mark.parametrize("count", ["²", "٣", "-1", "1.5"])
def test_the_fluent_schedule_refuses_counts_that_are_not_ascii_digits(count):
    """str.isdigit takes '²' (int() then raised, an InternalError) and other scripts'
    digits ('٣' was read as 3): a count is ASCII digits only."""
    with pytest.raises(ucf.ScheduleError, match="positive integer"):
        ucf.compile(
            "C(i,n) = A(i,k) * B(k,n)",
            dynamic={"A": (32, 1)},
            schedule=ucf.Schedule().condense("k", "A", count),
        )
    with pytest.raises((ucf.ScheduleError, ucf.ParseError)):
        ucf.compile("y(i) = A(i,j) * x(j)", schedule=ucf.Schedule().split("i", "i0", "i1", count))
