"""A sparse output whose entries are one operand's, position for position
(``ucf.lower.assembly._same_structure``): the compute pass takes the operand's
positions for the output's, so its loop carries no counter and runs over all the
positions at once (``ucf.passes.flat_positions``), in parallel as the rows did.
Against scipy on both CPU targets and 1 and 2 threads, over empty rows, stored zeros
(kept, as scipy keeps them), zero-size matrices and a dense operand beside the
sparse one; and under ASan."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.asan import run_under_asan
from tests.helpers import TARGETS
from ucf.ir.nodes import While
from ucf.ir.walk import loops

FLAT = "flat pass: loop i"


def _matrix(rows: int, cols: int, seed: int) -> sp.csr_matrix:
    m = sp.random(rows, cols, density=0.2, format="csr", random_state=seed)
    if rows > 3:
        m = m.tolil()
        m[1, :] = 0  # an empty row
        m[rows - 1, :] = 0  # and the last
        m = m.tocsr()
        m.eliminate_zeros()
    if m.nnz:
        m.data[::4] = 0.0  # stored zeros stay entries
    return m


def _same(got: ucf.Tensor, want: sp.csr_matrix) -> None:
    g = got.to_scipy().tocsr()
    np.testing.assert_array_equal(g.indptr, want.indptr)
    np.testing.assert_array_equal(g.indices, want.indices)
    np.testing.assert_allclose(g.data, want.data, rtol=1e-15)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("threads", [1, 2])
def test_scale_copies_the_structure(target, threads):
    m = _matrix(300, 70, 1)
    a = ucf.from_scipy(m, format="csr")
    x = np.random.default_rng(2).random(300) + 0.5
    k = ucf.compile("C(i,j) = 2*A(i,j)", formats={"A": "csr", "C": "csr"}, target=target)
    d = ucf.compile("C(i,j) = A(i,j)/x(i)", formats={"A": "csr", "C": "csr"}, target=target)
    ucf.set_num_threads(threads)
    _same(k(A=a), (2 * m).tocsr())
    rows = np.repeat(x, np.diff(m.indptr))
    want = sp.csr_matrix((m.data / rows, m.indices, m.indptr), shape=m.shape)
    _same(d(A=a, x=x), want)
    assert FLAT in k.cin  # the plan of the call
    assert FLAT not in d.cin  # a row reads its x(i): the rows stay


@pytest.mark.parametrize("shape", [(0, 4), (4, 0), (5, 5)])
def test_zero_size_and_all_empty(shape):
    k = ucf.compile("C(i,j) = -A(i,j)", formats={"A": "csr", "C": "csr"})
    m = sp.csr_matrix(shape)
    out = k(A=ucf.from_scipy(m, format="csr")).to_scipy()
    assert out.shape == shape and out.nnz == 0


@pytest.mark.parametrize("target", TARGETS)
def test_an_operand_read_twice_is_walked_once(target):
    """``A(i,j)*A(i,j)`` walks A's positions once (``Lowerer._same_reads``), where two
    iterators merged each row with itself; beside another operand, summed, squared
    into a scalar, and read transposed (not the same read: merged as before)."""
    m, b = _matrix(50, 50, 7), _matrix(50, 50, 8)
    fm = {"A": "csr", "C": "csr"}
    sq = ucf.compile("C(i,j) = A(i,j)*A(i,j)", formats=fm, target=target)
    # ucf keeps the entries of stored zeros, as it did merging (scipy's multiply drops them)
    _same(sq(A=m), sp.csr_matrix((m.data**2, m.indices, m.indptr), shape=m.shape))
    assert FLAT in sq.cin and not any(isinstance(s, While) for _, s in loops(sq.llir[-1].body))
    both = ucf.compile("C(i,j) = A(i,j)*B(i,j) + A(i,j)", formats={**fm, "B": "csr"}, target=target)
    np.testing.assert_allclose(both(A=m, B=b).to_numpy(), (m.multiply(b) + m).toarray())
    total = ucf.compile("s = A(i,j)*A(i,j)", formats={"A": "csr"}, target=target)
    assert float(total(A=m).to_numpy()) == pytest.approx((m.data**2).sum(), rel=1e-12)
    tr = ucf.compile("C(i,j) = A(i,j)*A(j,i)", formats=fm, target=target)
    np.testing.assert_allclose(tr(A=m).to_numpy(), m.multiply(m.T).toarray())


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("schedule", [None, "reorder(i,j)"])
def test_an_operand_with_a_fill_read_twice_keeps_both_reads(target, schedule):
    """``A - A + B`` with A read as -inf where absent: two reads give IEEE's NaN there
    (-inf - -inf), as before the shared walk and as tests/toolchain/test_asan.py holds
    it; one walk folded it to -inf (docs/language.md's structural rule), so a tensor
    with a fill keeps its two reads. Against numpy, every entry."""
    a = _matrix(30, 30, 9).toarray()
    a = np.where(a != 0, a, -np.inf)
    b = np.roll(_matrix(30, 30, 10).toarray(), 1, axis=1)
    fa = "csr fill=-inf"
    k = ucf.compile(
        "S(i,j) = A(i,j) - A(i,j) + B(i,j)",
        {"S": "csr", "A": fa, "B": "csr"},
        schedule=schedule,
        target=target,
    )
    with np.errstate(invalid="ignore"):
        want = a - a + b
    got = k(A=ucf.from_numpy(a, format=fa), B=b).to_numpy()
    np.testing.assert_array_equal(got, want)


def test_what_keeps_its_counter():
    """A sum, a second sparse operand, or an output stored otherwise than the operand
    keeps the counted append, and is still right."""
    m, b = _matrix(40, 30, 3), _matrix(40, 30, 4)
    add = ucf.compile("C(i,j) = A(i,j) + 1", formats={"A": "csr", "C": "csr"})
    prod = ucf.compile("C(i,j) = A(i,j)*B(i,j)", formats={"A": "csr", "B": "csr", "C": "csr"})
    np.testing.assert_allclose(add(A=m).to_numpy(), m.toarray() + 1)
    np.testing.assert_allclose(prod(A=m, B=b).to_numpy(), m.multiply(b).toarray())
    assert FLAT not in add.cin and FLAT not in prod.cin


def test_scale_under_asan(asan_cc, tmp_path):
    m = _matrix(9, 11, 6)
    k = ucf.compile("C(i,j) = 3*A(i,j)", formats={"A": "csr", "C": "csr"}, target="c")
    assert FLAT in k.cin
    ops = {"A": ucf.from_scipy(m, format="csr")}
    out = run_under_asan(asan_cc, tmp_path, k, "csr", (9, 11), {"i": 9, "j": 11}, ops)
    _same(out, (3 * m).tocsr())
