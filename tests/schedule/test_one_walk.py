"""``C.T @ S`` into a dense output whose leading variable no sparse operand reads (the
gradient of an SDDMM's D, ``grad_D(k,j) = G(i,j)*B(i,j)*C(i,k)``): the default walks the
sparse operands once, k innermost, while the output fits in cache, and once per k
(k outermost) beyond (``ucf.schedule.transposed_products._one_walk``). Each plan's kernel
is checked against scipy on both CPU targets, one and two threads, with empty rows and
K of 1 and of 5, a width no vector divides."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import TARGETS, rand_sparse
from ucf import pipeline
from ucf.format.format import parse_format
from ucf.schedule.stats import Stats
from ucf.schedule.transposed_products import MAX_SCATTERED

GRAD_D = "grad_D(k,j) = G(i,j) * B(i,j) * C(i,k)"
SPMM_T = "Y(k,j) = A(i,j) * X(i,k)"
CSR = {"G": "csr", "B": "csr", "A": "csr", "S": "csr"}


def _formats(expr: str) -> dict:
    return {n: parse_format(f) for n, f in CSR.items() if f"{n}(" in expr}


def _first(expr: str, stats: Stats, threads: int):
    """The first proposal the checker accepts: the plan a call with ``stats`` gets."""
    fmts = _formats(expr)
    for choice in pipeline.proposals(expr, fmts, stats, threads=threads):
        try:
            ucf.compile(expr, {n: f for n, f in CSR.items() if n in fmts}, schedule=choice.text)
        except ucf.ScheduleError:
            continue
        return choice
    raise AssertionError("no proposal passed")


def _stats(expr: str, rows: int, K: int) -> Stats:
    sparse = {n: rows * 10 for n in _formats(expr)}
    return Stats({"i": rows, "j": rows, "k": K}, sparse)


def _reference(expr: str, ops: dict) -> np.ndarray:
    if expr == GRAD_D:
        return (ops["G"].multiply(ops["B"]).T @ ops["C"]).T
    return (ops["A"].T @ ops["X"]).T


def _operands(expr: str, n: int, K: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    b = sp.csr_matrix(rand_sparse(rng, (n, n), 0.2, empty_rows=3))
    dense = rng.standard_normal((n, K))
    if expr == SPMM_T:
        return {"A": b, "X": dense}
    # G on B's pattern but one entry fewer in each row that has two: a co-iteration.
    g = b.copy()
    g.data = rng.standard_normal(g.nnz)
    for r in range(n):
        if g.indptr[r + 1] - g.indptr[r] > 1:
            g.data[g.indptr[r]] = 0.0
    g.eliminate_zeros()
    return {"G": g, "B": b, "C": dense}


@pytest.mark.parametrize("expr", [GRAD_D, SPMM_T])
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_the_model_walks_once_while_the_output_fits(expr, threads):
    small = _first(expr, _stats(expr, 100_000, 8), threads)
    assert "reorder(i, j, k)" in small.text and "bound(k, k_b, 8" in small.text, small.text
    assert not any("parallelize" in str(c) for c in small.commands)
    assert any("once in storage order" in w and "800000 entries" in w for w in small.why)
    big = _first(expr, _stats(expr, 100_000, 64), threads)
    assert "reorder(k, i, j)" in big.text, big.text
    assert any("once per k" in w and "too many to stay in cache" in w for w in big.why)
    if threads == 2:
        assert "parallelize(k, CPUThread, NoRaces)" in big.text


def test_the_bound_is_the_outputs_entries():
    at = _first(GRAD_D, Stats({"i": MAX_SCATTERED, "j": MAX_SCATTERED, "k": 1}), 1)
    over = _first(GRAD_D, Stats({"i": MAX_SCATTERED, "j": MAX_SCATTERED, "k": 2}), 1)
    assert "reorder(i, j, k)" in at.text
    assert "reorder(k, i, j)" in over.text


def test_no_plan_without_statistics_or_where_a_sparse_operand_reads_k():
    assert not any("storage order" in w for w in _first(GRAD_D, None, 1).why)
    read = _first("Y(k,j) = A(i,j) * S(i,k)", _stats(SPMM_T, 1000, 8), 1)
    assert not any("once in storage order" in w for w in read.why)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("expr", [GRAD_D, SPMM_T])
@pytest.mark.parametrize("K", [1, 5])
def test_the_plans_against_scipy(target, threads, expr, K):
    """Both plans the model proposes, run at small sizes (empty rows; K of 1 and odd)."""
    ops = _operands(expr, 37, K)
    want = _reference(expr, ops)
    fmts = {n: f for n, f in CSR.items() if n in ops}
    for rows in (1000, 1 << 22):
        choice = _first(expr, _stats(expr, rows, K), threads)
        k = ucf.compile(expr, fmts, schedule=choice.text, target=target)
        np.testing.assert_allclose(np.asarray(k(**ops)), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_a_call_that_pays_gets_the_walk(threads):
    """The default kernel at a size that gets a plan of its own: the gradient of D of
    ``ucf.gradients`` on an SDDMM with a CSR output, against scipy. D is row-major, so
    its gradient is written column-major (``ucf.autodiff.backward.scattered_last``),
    where walking A's entries once is the storage order itself."""
    n, K = 6000, 7
    b = sp.random(n, n, density=10 / n, format="csr", random_state=np.random.default_rng(2))
    b.sort_indices()
    C = np.random.default_rng(3).standard_normal((n, K))
    D = np.random.default_rng(4).standard_normal((K, n))
    fwd = ucf.compile("A(i,j) = B(i,j) * C(i,k) * D(k,j)", {"A": "csr", "B": "csr"})
    A = fwd(B=b, C=C, D=D)
    g = np.random.default_rng(5).standard_normal(len(A.vals))
    grad = ucf.Tensor(A.shape, A.format, A.levels, g)
    back = ucf.gradients(fwd)
    got = np.asarray(back("D", grad, {"B": b, "C": C, "D": D}))
    gb = sp.csr_matrix((g * b.data, b.indices, b.indptr), shape=b.shape)
    np.testing.assert_allclose(got, (gb.T @ C).T, rtol=1e-10, atol=1e-10)
    assert "loop order i, j, k" in back.kernel("D").cin, back.kernel("D").cin
    assert back.relaid("D") is not None and got.flags.c_contiguous
