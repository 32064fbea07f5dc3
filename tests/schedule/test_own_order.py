"""A sum of terms that reads one operand in two orders: each term precomputed into a
dense workspace, the producer of the transposed read walking its operand as stored
and scattering (``ucf.schedule.own_order``), against scipy."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import TARGETS, rand_dense, rand_sparse

BOTH = "y(i) = A(i,j)*x(j) + A(j,i)*x(j)"
BY_HAND = "precompute(A(i,j)*x(j), i, i, v); precompute(A(j,i)*x(j), i, i, w)"


def _square(n: int, per_row: int, seed: int) -> sp.csr_matrix:
    """About ``per_row`` entries in each row but the first three (left empty), built
    sparse (a dense n x n array would not fit for the largest n)."""
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), per_row)
    keep = rows >= 3
    rows, cols = rows[keep], rng.integers(0, n, len(rows))[keep]
    a = sp.csr_matrix((rng.integers(1, 10, len(rows)).astype(float), (rows, cols)), (n, n))
    a.sum_duplicates()
    return a


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("schedule", [None, f"{BY_HAND}; parallelize(i, CPUThread, NoRaces)"])
@pytest.mark.parametrize("n", [1, 9, 3000])  # 3000 x 10 a row: past the threads' threshold
def test_a_transposed_term_reads_its_operand_as_stored(target, schedule, n, threads):
    a = _square(n, min(n, 10), seed=n)
    x = rand_dense(np.random.default_rng(1), n)
    k = ucf.compile(BOTH, formats={"A": "csr"}, schedule=schedule, target=target)
    assert "converted to" not in k.cin
    assert "scattering into w" in k.cin
    got = k(A=a, x=x).to_numpy()
    np.testing.assert_allclose(got, a @ x + a.T @ x, rtol=1e-12)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(7, 4), (4, 7), (1, 5), (6, 1)])
def test_rectangular_operands_each_walked_as_stored(target, shape, threads):
    """``A`` (m x n) by rows and ``B`` (n x m) by columns, with empty rows; nothing is
    converted (the default distributes the sum over its terms)."""
    rng = np.random.default_rng(sum(shape))
    m, n = shape
    a = sp.csr_matrix(rand_sparse(rng, (m, n), 0.4, empty_rows=1))
    b = sp.csr_matrix(rand_sparse(rng, (n, m), 0.4, empty_rows=1))
    x, z = rand_dense(rng, n), rand_dense(rng, n)
    k = ucf.compile(
        "y(i) = A(i,j)*x(j) - B(j,i)*z(j)", formats={"A": "csr", "B": "csr"}, target=target
    )
    assert "converted to" not in k.cin
    np.testing.assert_allclose(k(A=a, B=b, x=x, z=z).to_numpy(), a @ x - b.T @ z, rtol=1e-12)


@pytest.mark.parametrize("target", TARGETS)
def test_the_default_chooses_the_scatter_by_its_work_estimate(target):
    """With the statistics of a call past the replanning threshold the model weighs the
    plain nest (a merge, A converted) against one nest per term, and says so."""
    n = 30000
    a = _square(n, 10, seed=3)
    x = rand_dense(np.random.default_rng(2), n)
    k = ucf.compile(BOTH, formats={"A": "csr"}, target=target)
    np.testing.assert_allclose(k(A=a, x=x).to_numpy(), a @ x + a.T @ x, rtol=1e-12)
    chosen = [line for line in k.cin.splitlines() if "each walking its operands as stored" in line]
    assert chosen and "steps, where one loop over j" in chosen[0]
    assert "A converted on every call" in chosen[0]


def test_a_sparse_output_still_converts():
    """A compressed y appends from listed workspaces: the producers keep the nest's order
    and A is converted, as before."""
    a = _square(12, 4, seed=5)
    x = rand_dense(np.random.default_rng(6), 12)
    k = ucf.compile(BOTH, formats={"A": "csr", "y": "C"}, schedule=BY_HAND)
    assert "converted to" in k.cin
    np.testing.assert_allclose(k(A=a, x=x).to_numpy(), a @ x + a.T @ x, rtol=1e-12)


def test_a_producer_sharing_a_loop_that_walks_against_storage_is_refused_or_converts():
    """One term precomputed, the other left in the consumer: the schedule is refused by
    name as before (the consumer still sums over j outside the workspace)."""
    with pytest.raises(ucf.ScheduleError, match="precompute that term too"):
        ucf.compile(BOTH, formats={"A": "csr"}, schedule="precompute(A(j,i)*x(j), i, i, w)")


@pytest.mark.parametrize("target", TARGETS)
def test_a_repeated_index_in_a_blocked_operand_is_left_to_the_loop_order(target):
    """Statement fuzzer (test_fuzz_c): a precompute whose operand repeats a variable
    (``A(j,j)``, blocked) walks nothing in an order of its own; it was a KeyError."""
    rng = np.random.default_rng(9)
    a, b = rand_sparse(rng, (4, 4), 0.6), rand_sparse(rng, (4, 4), 0.6)
    k = ucf.compile(
        "X(i,j) = (((A(j,j)) * (A(i,i))) * (A(j,j))) * (B(i,j))",
        formats={"A": "bdcsr(2,3)", "B": "CU:0,1"},
        target=target,
    )
    d = np.diag(a)
    want = d[None, :] * d[:, None] * d[None, :] * b
    np.testing.assert_allclose(k(A=a, B=b).to_numpy(), want, rtol=1e-12)


TACO_SPELLING = "precompute(A(j,i)*x(j), i, iw, w); reorder(j, iw)"


@pytest.mark.parametrize("target", TARGETS)
def test_taco_producer_reorder_refused_where_it_would_move_other_terms(target):
    """TACO's ``precompute(A(j,i)*x(j), i, iw, w); reorder(j, iw)`` reorders only w's
    producer; ucf's ``iw`` takes i's place in the whole nest, so on BOTH the reorder
    would move the other term's loop over j too: refused naming what was written and
    the spelling that runs the producer in A's order; that spelling, against scipy."""
    written = f"precompute(A(i,j)*x(j), i, i, v); {TACO_SPELLING}"
    with pytest.raises(ucf.ScheduleError) as refused:
        ucf.compile(BOTH, formats={"A": "csr"}, schedule=written, target=target)
    said = str(refused.value)
    assert said.startswith("reorder(j, iw) after precompute(A(j,i)*x(j), i, iw, w): ")
    assert "the loop over j of A(i, j)" in said
    assert "write precompute(A(j,i)*x(j), i, i, w) and no reorder" in said
    assert "spelled reorder(j, i) before the precompute" in said
    a = _square(40, 5, seed=11)
    x = rand_dense(np.random.default_rng(12), 40)
    k = ucf.compile(BOTH, formats={"A": "csr"}, schedule=BY_HAND, target=target)
    assert "converted to" not in k.cin and "scattering into w" in k.cin
    np.testing.assert_allclose(k(A=a, x=x).to_numpy(), a @ x + a.T @ x, rtol=1e-12)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("statement", "want"),
    [
        ("y(i) = A(j,i)*x(j)", lambda a, x, z: a.T @ x),
        ("y(i) = A(j,i)*x(j) + z(i)", lambda a, x, z: a.T @ x + z),
    ],
)
def test_taco_producer_reorder_accepted_where_the_readings_agree(statement, want, target):
    """With nothing but the producer's term looping over j, reordering the whole nest is
    TACO's meaning too: j outside iw, A walked as stored by rows, scattering into w."""
    a = _square(30, 4, seed=13)
    rng = np.random.default_rng(14)
    x, z = rand_dense(rng, 30), rand_dense(rng, 30)
    k = ucf.compile(statement, formats={"A": "csr"}, schedule=TACO_SPELLING, target=target)
    assert "loop order j, i" in k.cin and "converted to" not in k.cin
    operands = {"A": a, "x": x} | ({"z": z} if "z(i)" in statement else {})
    np.testing.assert_allclose(k(**operands).to_numpy(), want(a, x, z), rtol=1e-12)
