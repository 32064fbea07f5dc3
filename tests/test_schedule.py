"""Schedules: parsing, the fluent chain, reorder against numpy, and clear refusals."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from ucf.cin.schedule import parse_schedule


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
        ("pos(j, jpos, A)", "not supported yet"),
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
