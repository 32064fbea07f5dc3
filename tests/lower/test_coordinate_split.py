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
from tests.helpers import TARGETS, needs_cc, rand_sparse

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


NESTED = [
    pytest.param("split(i,iX,iY,4); split(iY,iY1,iY2,2)", "c", marks=needs_cc),
    ("split(i,iX,iY,4); split(iY,iY1,iY2,2)", "llvm"),
    ("divide(i,iX,iY,5); split(iY,iY1,iY2,3)", "llvm"),
    ("split(i,iX,iY,8); divide(iY,iY1,iY2,3)", "llvm"),
    ("split(i,iX,iY,8); split(iY,iY1,iY2,4); split(iY2,iZ1,iZ2,2)", "llvm"),
    ("split(i,iX,iY,4); split(iY,iY1,iY2,2); parallelize(iX,CPUThread,NoRaces)", "llvm"),
]


@pytest.mark.parametrize("schedule,target", NESTED)
@pytest.mark.parametrize("op", ["*", "+"])
@pytest.mark.parametrize("out", ["U", "C"])
def test_splits_of_a_coordinate_block(target, schedule, op, out):
    """A split of the inner loop of a co-iterated split splits its block of coordinates
    again, each operand narrowed to the smaller block."""
    if out == "C" and "parallelize" in schedule:
        pytest.skip("a compressed output is appended in order, serially")
    a, b = vectors(103, 2, 4, density=0.4)
    k = ucf.compile(
        f"C(i) = A(i){op}B(i)",
        formats={"A": "C", "B": "C", "C": out},
        schedule=schedule,
        target=target,
    )
    got = k(A=ucf.from_numpy(a, format="C"), B=ucf.from_numpy(b, format="C")).to_numpy()
    np.testing.assert_array_equal(got, a * b if op == "*" else a + b)


@pytest.mark.parametrize(
    "order,target",
    [
        pytest.param("iX1,iY1,iX2", "c", marks=needs_cc),
        *((o, "llvm") for o in ("iX1,iX2,iY1", "iX1,iY1,iX2", "iX2,iX1,iY1", "iY1,iX2,iX1")),
    ],
)
def test_taco_multilevel_tiling(order, target):
    """TACO's scheduling test multilevel_tiling: both halves of a co-iterated split split
    again, and the block loops in any order above the co-iteration."""
    a, b = vectors(64, 2, 5, density=0.5)
    schedule = f"split(i,iX,iY,2); split(iX,iX1,iX2,2); split(iY,iY1,iY2,2); reorder({order},iY2)"
    k = ucf.compile(
        "C(i) = A(i)*B(i)", formats={"A": "C", "B": "C"}, schedule=schedule, target=target
    )
    got = k(A=ucf.from_numpy(a, format="C"), B=ucf.from_numpy(b, format="C")).to_numpy()
    np.testing.assert_array_equal(got, a * b)


def test_block_loops_of_a_compressed_output_keep_their_order():
    """Moving a block loop outside another would append C's coordinates out of order."""
    schedule = (
        "split(i,iX,iY,2); split(iX,iX1,iX2,2); split(iY,iY1,iY2,2); reorder(iY1,iX1,iX2,iY2)"
    )
    with pytest.raises(ucf.ScheduleError, match="appended in loop order"):
        ucf.compile("C(i) = A(i)*B(i)", formats={"A": "C", "B": "C", "C": "C"}, schedule=schedule)
