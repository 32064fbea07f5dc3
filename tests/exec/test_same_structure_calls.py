"""Calls of a kernel whose sparse output has an operand's structure (``2*A(i,j)``,
``ucf.exec.operand_structure``): the positions are copied from the operand's, no pass
counts them, and a repeated call replays (``ucf.exec.replay``). Against scipy on both
CPU targets and 1 and 2 threads, over empty rows and stored zeros; a replayed call must
see every change of its operand as a first call does (a new shape, a new count of
entries, an order broken or an index out of range in place), and a result must own
its arrays (neither writes to it nor to the operand reach the other)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import TARGETS
from ucf.exec import replay as replay_module

CALLS = replay_module.PACK_AFTER + 3  # past the packed trampoline's start


def _matrix(rows: int, cols: int, seed: int, layout: str = "csr") -> sp.spmatrix:
    """A random matrix with an empty first, second and last row and stored zeros."""
    m = sp.random(rows, cols, density=0.2, format="lil", random_state=seed)
    for r in (0, 1, rows - 1):
        m[r, :] = 0
    m = m.tocsr()
    m.eliminate_zeros()
    m.data[::4] = 0.0  # stored zeros stay entries, as scipy's 2*A keeps them
    return m.asformat(layout)


def _same(got: ucf.Tensor, want: sp.spmatrix) -> None:
    """The same entries, stored zeros too, in the same order (as CSR, or CSC for CSC)."""
    layout = "csc" if want.format == "csc" else "csr"
    g, w = got.to_scipy().asformat(layout), want.asformat(layout)
    np.testing.assert_array_equal(g.indptr, w.indptr)
    np.testing.assert_array_equal(g.indices, w.indices)
    np.testing.assert_array_equal(g.data, w.data)


@pytest.mark.parametrize("layout", ["csr", "csc", "coo", "dcsr"])
def test_repeated_calls_match_scipy(target, threads, layout, replays):
    """CSR and CSC outputs keep the operand's structure and replay; COO and DCSR are
    counted as before (their outputs are computed in another format), every call
    right (``target`` and ``threads``: tests/conftest.py's)."""
    m = _matrix(400, 90, 1, "csc" if layout == "csc" else "csr")
    a = m if layout in ("csr", "csc") else ucf.from_scipy(m, format=layout)
    k = ucf.compile("C(i,j) = 2*A(i,j)", {"A": layout, "C": layout}, target=target)
    for _ in range(CALLS):
        _same(k(A=a), 2 * m)
    same = layout in ("csr", "csc")
    assert bool(k._plan.same_structure) is same
    assert len(replays) == (CALLS - 1 if same else 0)


@pytest.mark.parametrize("target", TARGETS)
def test_a_tensor_operand_and_a_dense_one_beside_it(target, replays):
    m = _matrix(60, 40, 2)
    x = np.random.default_rng(3).random(60) + 0.5
    k = ucf.compile("C(i,j) = A(i,j)/x(i)", {"A": "csr", "C": "csr"}, target=target)
    a = ucf.from_scipy(m)
    want = sp.csr_matrix(m.multiply(1 / x[:, None]))
    for _ in range(3):
        got = k(A=a, x=x).to_scipy()
        np.testing.assert_array_equal(got.indices, m.indices)
        np.testing.assert_allclose(got.data, m.data / np.repeat(x, np.diff(m.indptr)))
    assert abs(got - want).max() < 1e-14 and len(replays) == 2
    x *= 2.0  # read again, in place
    np.testing.assert_allclose(k(A=a, x=x).to_numpy(), want.toarray() / 2)


def test_a_result_owns_its_arrays(replays):
    """The output's positions are a copy: writing the result leaves the operand alone,
    and writing the operand in place leaves earlier results alone."""
    m = _matrix(50, 30, 4)
    keep = m.copy()
    k = ucf.compile("C(i,j) = 2*A(i,j)", {"A": "csr", "C": "csr"})
    first, second = k(A=m), k(A=m)
    assert len(replays) == 1
    for c in (first, second):
        for arr in (*c.arrays, c.vals):
            assert not any(np.may_share_memory(arr, b) for b in (m.indptr, m.indices, m.data))
        c.levels[1]["pos"][:] = 0
        c.levels[1]["crd"][:] = 0
        c.vals[:] = -1.0
    _same(ucf.from_scipy(m), keep)
    before = k(A=m)
    m.data *= 3.0
    m.indptr[2:] = m.indptr[2:]  # written in place, unchanged
    _same(before, 2 * keep)
    _same(k(A=m), 6 * keep)
    assert len(replays) == 3


def test_a_changed_count_of_entries_is_read(replays):
    """The last row cut short in place (``indptr[-1]`` below the arrays' length, which
    the checks allow), then arrays swapped for longer ones: each call right."""
    m = _matrix(40, 30, 5).tolil()
    m[39, 3] = 4.0  # the last row holds an entry
    m = m.tocsr()
    k = ucf.compile("C(i,j) = 2*A(i,j)", {"A": "csr", "C": "csr"})
    _same(k(A=m), 2 * m)
    m.indptr[-1] -= 1
    cut = sp.csr_matrix((m.data[:-1], m.indices[:-1], m.indptr), shape=m.shape)
    _same(k(A=m), 2 * cut)
    assert len(replays) == 1
    more = _matrix(40, 30, 6)
    m.indptr, m.indices, m.data = more.indptr, more.indices, more.data
    _same(k(A=m), 2 * more)  # other arrays: bound again
    _same(k(A=m), 2 * more)
    assert len(replays) == 2


def test_a_new_shape_is_bound_again(replays):
    m = _matrix(40, 30, 7)
    k = ucf.compile("C(i,j) = 2*A(i,j)", {"A": "csr", "C": "csr"})
    _same(k(A=m), 2 * m)
    m.resize((45, 30))
    got = k(A=m)
    assert got.shape == (45, 30)
    _same(got, 2 * m)
    assert len(replays) == 0


def _error(k, m) -> str:
    with pytest.raises(ucf.UcfError) as e:
        k(A=m)
    return str(e.value)


def test_a_replayed_call_fails_as_a_first_one(replays):
    """An index out of range, written in place after calls that replayed: the same
    error as a new kernel's first call gives."""
    m = _matrix(40, 30, 8)
    k = ucf.compile("C(i,j) = 2*A(i,j)", {"A": "csr", "C": "csr"})
    k(A=m), k(A=m)
    m.indices[5] = 30
    fresh = ucf.compile("C(i,j) = 2*A(i,j)", {"A": "csr", "C": "csr"}, target="c")
    assert _error(k, m) == _error(fresh, m)
    assert "30" in _error(k, m) and len(replays) == 1


def test_an_order_broken_in_place_is_packed_as_on_a_first_call(replays):
    """Two neighbours swapped in place: the replay sees the order changed and the call
    packs the operand, as a first call does; the remembered call replays again once
    it is sorted."""
    m = _matrix(40, 30, 9)
    k = ucf.compile("C(i,j) = 2*A(i,j)", {"A": "csr", "C": "csr"})
    k(A=m), k(A=m)
    row = int(np.argmax(np.diff(m.indptr) >= 2))
    s = m.indptr[row]
    m.indices[s], m.indices[s + 1] = m.indices[s + 1], m.indices[s]
    fresh = ucf.compile("C(i,j) = 2*A(i,j)", {"A": "csr", "C": "csr"}, target="c")
    want = fresh(A=m).to_scipy()
    assert want.has_sorted_indices
    np.testing.assert_array_equal(k(A=m).to_numpy(), 2 * m.toarray())
    _same(k(A=m), want)
    assert len(replays) == 1
    m.sort_indices()
    k(A=m), k(A=m)
    assert len(replays) == 3


def test_out_and_plus_equals_into_a_sparse_output_say_which():
    """``out=`` for a sparse output, and ``+=`` into one, are refused, each named as
    written (``out=`` with a plain ``=`` had been called a '+=')."""
    m = sp.random(5, 5, density=0.4, format="csr", random_state=0)
    k = ucf.compile("C(i,j) = 2*A(i,j)", {"A": "csr", "C": "csr"})
    with pytest.raises(ucf.OperandError, match=r"out= is not supported") as e:
        k(A=m, out=np.zeros((5, 5)))
    assert "+=" not in str(e.value)
    k = ucf.compile("C(i,j) += A(i,j)", {"A": "csr", "C": "csr"})
    with pytest.raises(ucf.OperandError, match=r"'\+=' into it is not supported"):
        k(A=m)
