"""``split``/``divide`` of a loop that co-iterates several sparse operands.

Such a loop has no dense range to strip-mine, so it is split in coordinate
space, as in TACO: blocks of coordinates, each operand narrowed to the block
by binary search.  Checked against numpy for intersections, unions, flat
co-iteration of many operands, reductions and sparse outputs, serial and with
the block loop in parallel.
"""

from __future__ import annotations

import numpy as np
import pytest

import ucf
from tests.helpers import TARGETS, rand_sparse

SCHEDULES = [
    "split(i,i0,i1,8)",
    "split(i,i0,i1,1)",
    "split(i,i0,i1,1000)",
    "divide(i,i0,i1,3)",
    "divide(i,i0,i1,1)",
]


def vectors(n, count, seed, density=0.3):
    rng = np.random.default_rng(seed)
    return [rand_sparse(rng, (n,), density, empty_rows=0) for _ in range(count)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(
    "expr,reference",
    [
        ("C(i) = A(i)*B(i)", lambda a, b, d: a * b),
        ("C(i) = A(i)+B(i)", lambda a, b, d: a + b),
        ("C(i) = A(i)*B(i) + D(i)", lambda a, b, d: a * b + d),
        ("C(i) = A(i) + B(i) - D(i)", lambda a, b, d: a + b - d),
    ],
)
@pytest.mark.parametrize("out", ["U", "C"])
def test_vector_expressions(target, schedule, expr, reference, out):
    a, b, d = vectors(100, 3, 1)
    formats = {"A": "C", "B": "C", "D": "C", "C": out}
    names = [n for n in "ABD" if f"{n}(i)" in expr]
    k = ucf.compile(
        expr, formats={n: formats[n] for n in [*names, "C"]}, schedule=schedule, target=target
    )
    ops = {n: ucf.from_numpy(x, format="C") for n, x in zip("ABD", (a, b, d), strict=True)}
    got = k(**{n: ops[n] for n in names}).to_numpy()
    np.testing.assert_array_equal(got, reference(a, b, d))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("strategy", ["Atomics", "ParallelReduction"])
def test_dot_product_blocks_in_parallel(target, schedule, strategy):
    a, b = vectors(257, 2, 2, density=0.5)
    sched = f"{schedule}; parallelize(i0,CPUThread,{strategy})"
    k = ucf.compile("c = A(i)*B(i)", formats={"A": "C", "B": "C"}, schedule=sched, target=target)
    got = k(A=ucf.from_numpy(a, format="C"), B=ucf.from_numpy(b, format="C")).to_numpy()
    np.testing.assert_allclose(got, np.dot(a, b), rtol=1e-12)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("schedule", ["split(j,j0,j1,4)", "divide(j,j0,j1,2)"])
@pytest.mark.parametrize("fx", ["C", "U"])
def test_spmv_with_a_sparse_vector(target, schedule, fx):
    """TACO's sparse SpMV: j co-iterates a CSR row and a compressed x."""
    rng = np.random.default_rng(3)
    A = rand_sparse(rng, (9, 13), 0.4)
    x = rand_sparse(rng, (13,), 0.5, empty_rows=0)
    sched = f"{schedule}; parallelize(i,CPUThread,NoRaces)"
    k = ucf.compile(
        "y(i) = A(i,j)*x(j)", formats={"A": "csr", "x": fx}, schedule=sched, target=target
    )
    got = k(A=ucf.from_numpy(A, format="csr"), x=ucf.from_numpy(x, format=fx)).to_numpy()
    np.testing.assert_array_equal(got, A @ x)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("out", ["UU", "csr"])
def test_matrix_add_split_inside_rows(target, out):
    rng = np.random.default_rng(4)
    A, B = rand_sparse(rng, (7, 30), 0.2), rand_sparse(rng, (7, 30), 0.2)
    k = ucf.compile(
        "S(i,j) = A(i,j) + B(i,j)",
        formats={"A": "csr", "B": "csr", "S": out},
        schedule="split(j,j0,j1,7)",
        target=target,
    )
    got = k(A=ucf.from_numpy(A, format="csr"), B=ucf.from_numpy(B, format="csr"))
    np.testing.assert_array_equal(got.to_numpy(), A + B)


@pytest.mark.parametrize("target", TARGETS)
def test_four_operands_in_one_flat_loop_split(target):
    a, b, d, e = vectors(64, 4, 5)
    k = ucf.compile(
        "C(i) = A(i) + B(i) + D(i) + E(i)",
        formats=dict.fromkeys("ABDE", "C") | {"C": "C"},
        schedule="split(i,i0,i1,5)",
        target=target,
    )
    got = k(**{n: ucf.from_numpy(x, format="C") for n, x in zip("ABDE", (a, b, d, e), strict=True)})
    np.testing.assert_array_equal(got.to_numpy(), a + b + d + e)


def test_empty_operands_and_the_cin():
    k = ucf.compile("C(i) = A(i)*B(i)", formats={"A": "C", "B": "C"}, schedule="split(i,i0,i1,8)")
    assert "forall(i0, forall(i1" in k.cin
    z = np.zeros(20)
    got = k(A=ucf.from_numpy(z, format="C"), B=ucf.from_numpy(z, format="C")).to_numpy()
    np.testing.assert_array_equal(got, z)
