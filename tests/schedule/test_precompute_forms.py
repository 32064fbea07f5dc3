"""TACO's three-argument ``precompute(expr, i, iw)``, which names its workspace,
checked with TACO's published CPU schedules verbatim against numpy and scipy."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import TARGETS, rand_sparse

# tensor-compiler.org's default CPU schedules (MTTKRP and SpGEMM), word for word
# apart from the spaces TACO's web form puts in unit names.
MTTKRP = (
    "reorder(i,k,l,j); precompute(B(i,k,l) * D(l,j),j,j); split(i,i0,i1,32); "
    "parallelize(i0,CPUThread,NoRaces)"
)
SPGEMM = (
    "reorder(i,k,j); precompute(B(i,k) * C(k,j),j,j); assemble(A,Insert); "
    "parallelize(i,CPUThread,NoRaces)"
)


@pytest.mark.parametrize("target", TARGETS)
def test_taco_mttkrp_schedule(target):
    rng = np.random.default_rng(1)
    B = rand_sparse(rng, (40, 7, 6), 0.2, empty_rows=3)
    C, D = rng.random((7, 5)), rng.random((6, 5))
    k = ucf.compile(
        "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)", formats={"B": "csf"}, schedule=MTTKRP, target=target
    )
    assert "precomputed into workspace w(j)" in k.cin
    got = k(B=B, C=C, D=D).to_numpy()
    np.testing.assert_allclose(got, np.einsum("ikl,lj,kj->ij", B, D, C), rtol=1e-12)


@pytest.mark.parametrize("target", TARGETS)
def test_taco_spgemm_schedule(target):
    B = sp.random(50, 30, density=0.1, format="csr", random_state=2)
    C = sp.random(30, 40, density=0.1, format="csr", random_state=3)
    k = ucf.compile(
        "A(i,j) = B(i,k) * C(k,j)",
        formats={"A": "csr", "B": "csr", "C": "csr"},
        schedule=SPGEMM,
        target=target,
    )
    got = k(B=B, C=C)
    got.validate()
    np.testing.assert_allclose(got.to_numpy(), (B @ C).toarray(), rtol=1e-12)


def test_the_chosen_name_avoids_tensors_and_variables():
    A = sp.random(12, 9, density=0.3, format="csc", random_state=4)
    w = np.arange(9.0)
    k = ucf.compile(
        "y(i) = A(i,j) * w(j)", formats={"A": "csc"}, schedule="precompute(A(i,j)*w(j),i,i)"
    )
    assert "workspace w1(i)" in k.cin
    np.testing.assert_allclose(k(A=A, w=w).to_numpy(), A @ w)


def test_fluent_precompute_without_a_name():
    s = ucf.Schedule().reorder("i", "k", "j").precompute("B(i,k)*C(k,j)", "j", "j")
    assert str(s) == "reorder(i, k, j); precompute(B(i,k)*C(k,j), j, j)"
    named = ucf.Schedule().precompute("B(i,k)*C(k,j)", "j", "j", "acc")
    assert str(named).endswith("j, j, acc)")


@pytest.mark.parametrize(
    "schedule, words",
    [
        ("precompute(B(i,k)*C(k,j),j)", ["precompute takes (expr, i, iw) or (expr, i, iw, w)"]),
        ("reorder(i,k,j); precompute(B(i,k)*C(k,j),j,j,A)", ["workspace name A is already"]),
        ("reorder(i,k,j); precompute(B(i,k)*C(k,j),j,j,B)", ["workspace name B is already"]),
        ("reorder(i,k,j); precompute(B(i,k)*C(k*k,j),j,j)", ["expression does not parse", "^"]),
        ("fuse(i,k,f); precompute(B(i,k)*C(k,j),f,f)", ["f iterates several variables"]),
    ],
)
def test_bad_precompute_forms(schedule, words):
    with pytest.raises(ucf.ScheduleError) as e:
        ucf.compile("A(i,j) = B(i,k) * C(k,j)", formats={"B": "csr", "C": "csr"}, schedule=schedule)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "fmt,schedule",
    [
        ("dcsr", "precompute(A(i,j), j, j, w)"),
        ("coo", "precompute(A(i,j), j, j, w)"),
        ("bcsr(3,3)", "precompute(A(i_blk,i_in,j_blk,j_in), j_in, j_in, w)"),
        ("bcsc(3,3)", "precompute(A(i_blk,i_in,j_blk,j_in), j_in, j_in, w)"),
        ("bcsr(3,2)", "precompute(A(i_blk,i_in,j_blk,j_in), j_in, j_in, w)"),
    ],
)
@pytest.mark.parametrize("n", [6, 7])
def test_a_workspace_of_an_operand_absent_around_it(target, fmt, schedule, n):
    """The schedule fuzzer (seed 45, case 1926): A's workspace inside a loop where A's
    outer level found no entry (an empty row, an empty block) beside a dense D. The
    producer read A at a position that was not A's there: a wrong answer (the dense
    output of A + D) and a stray read. It now adds nothing, as A + D's own term did."""
    rng = np.random.default_rng(n)
    a = np.where(rng.random((n, n)) < 0.5, rng.integers(1, 5, (n, n)), 0).astype(float)
    a[3:6, 0:3] = a[0:3, 3:6] = a[2] = 0  # empty blocks and an empty row
    d = rng.integers(-5, 5, (n, n)).astype(float)
    for stmt, want in [
        ("C(i,j) = A(i,j) + D(i,j)", a + d),
        ("C(i,j) = A(i,j) + D(i,j) * D(j,i)", a + d * d.T),
    ]:
        k = ucf.compile(stmt, {"A": fmt}, schedule=schedule, target=target)
        got = k(A=ucf.from_numpy(a, format=fmt), D=d).to_numpy()
        np.testing.assert_array_equal(got, want, err_msg=f"{stmt} {fmt}")


@pytest.mark.parametrize("fmt", ["csr", "dense"])
def test_a_workspace_over_a_variable_only_its_term_sums_is_refused(fmt):
    """y(i) = A(i,j)*x(j) + x(i) sums over j only A*x: a workspace w(j) of it left the
    consumer's loop over j summing x(i) with it, once per j (the schedule fuzzer, seed
    45: A @ x + 9 x). The precompute is refused by name; without it the answer is right."""
    stmt, schedule = "y(i) = A(i,j) * x(j) + x(i)", "precompute(A(i,j)*x(j), j, jw, w)"
    with pytest.raises(ucf.ScheduleError, match="sums A\\(i, j\\) \\* x\\(j\\) over j on its own"):
        ucf.compile(stmt, {"A": fmt}, schedule=schedule)
    a, x = np.arange(1.0, 82.0).reshape(9, 9), np.arange(1.0, 10.0)
    got = ucf.compile(stmt, {"A": fmt})(A=ucf.from_numpy(a, fmt), x=x).to_numpy()
    np.testing.assert_array_equal(got, a @ x + x)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "schedule",
    [
        "precompute(A(i,j)*x(j), j, j, w); precompute(B(i,j)*z(j), j, j, v)",
        "precompute(A(i,j)*x(j) + B(i,j)*z(j), j, j, w); precompute(D(i,j)*x(j), j, j, v)",
    ],
)
def test_terms_of_one_sum_precomputed_one_after_another(target, schedule):
    """The statement sums every term over j: a later precompute of a term an earlier
    one left (which the lowerer wraps in the sum it distributes) is not the term summed
    on its own that test_a_workspace_over_a_variable_only_its_term_sums refuses."""
    rng = np.random.default_rng(5)
    a, b, d = (rand_sparse(rng, (7, 7), 0.4, empty_rows=1) for _ in range(3))
    x, z = rng.random(7), rng.random(7)
    stmt = "y(i) = A(i,j)*x(j) + B(i,j)*z(j)" + (" + D(i,j)*x(j)" if "D(" in schedule else "")
    fmts = {"A": "csr", "B": "csr"} | ({"D": "csr"} if "D(" in schedule else {})
    k = ucf.compile(stmt, fmts, schedule=schedule, target=target)
    ops = {n: ucf.from_numpy(m, format="csr") for n, m in zip("ABD", (a, b, d), strict=True)}
    ops = {n: t for n, t in ops.items() if n in fmts}
    got = k(**ops, x=x, z=z).to_numpy()
    want = a @ x + b @ z + (d @ x if "D(" in schedule else 0)
    np.testing.assert_allclose(got, want, rtol=1e-13)


@pytest.mark.parametrize("target", TARGETS)
def test_a_split_workspace_of_an_absent_row(target):
    """A workspace over a split's inner loop under a row A does not store: both sides
    fold away there, and the tiled loop is simply not made (it was refused as 'a sparse
    loop' once the sides were restricted)."""
    rng = np.random.default_rng(1)
    a = np.where(rng.random((8, 8)) < 0.5, rng.integers(1, 5, (8, 8)), 0).astype(float)
    a[2] = 0
    d = rng.integers(-5, 5, (8, 8)).astype(float)
    k = ucf.compile(
        "C(i,j) = A(i,j) + D(i,j)",
        {"A": "CU"},
        schedule="split(j,j0,j1,4); precompute(A(i,j),j1,j1,w)",
        target=target,
    )
    np.testing.assert_array_equal(k(A=ucf.from_numpy(a, format="CU"), D=d).to_numpy(), a + d)
