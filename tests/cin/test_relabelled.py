"""Copies into another layout return the conversion they read, relabelled
(``ucf.cin.relabelled``): checked against scipy and numpy transposes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from tests.helpers import TARGETS, rand_sparse

RELABELLED = "relabelled (each call returns the conversion"


def _call(k, **ops):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)
        return k(**ops)


def _scipy_matrix(shape, seed, empty=True):
    rng = np.random.default_rng(seed)
    d = rand_sparse(rng, shape, 0.3, empty_rows=1 if empty else 0)
    if empty and shape[1] > 1:
        d[:, rng.integers(shape[1])] = 0  # an empty column too
    return sp.csr_matrix(d)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "expr, out, ref",
    [
        ("C(j,i) = A(i,j)", "csr", lambda a: a.T.tocsr()),
        ("C(i,j) = A(i,j)", "csc", lambda a: a.tocsc()),
        ("C(j,i) = A(i,j)", "coo", lambda a: a.T.tocoo()),
        ("C(j,i) = A(i,j)", "dcsr", lambda a: a.T.tocsr()),
        ("C(i,j) = A(i,j)", "dcsc", lambda a: a.tocsc()),
    ],
)
@pytest.mark.parametrize("shape", [(7, 5), (1, 9), (0, 4), (6, 0)])
def test_copies_against_scipy(target, expr, out, ref, shape):
    a = _scipy_matrix(shape, sum(shape))
    k = ucf.compile(expr, formats={"A": "csr", "C": out}, target=target)
    got = _call(k, A=ucf.from_scipy(a))
    assert RELABELLED in k.cin, k.cin
    assert got.format.name == out and got.shape == ref(a).shape
    got.validate()
    np.testing.assert_array_equal(got.to_scipy().toarray(), ref(a).toarray())


def test_the_output_owns_its_arrays():
    """Writing the result leaves the operand alone, whatever a conversion shares."""
    a = _scipy_matrix((6, 8), 3)
    A = ucf.from_scipy(a)
    for expr, out in [("C(j,i) = A(i,j)", "csr"), ("C(i,j) = A(i,j)", "csc")]:
        got = _call(ucf.compile(expr, formats={"A": "csr", "C": out}), A=A)
        assert not any(np.may_share_memory(x, y) for x in got.arrays for y in A.arrays)
    got = _call(ucf.compile("C(i,j) = A(i,j)", formats={"A": "csc", "C": "csr"}), A=A)
    got.vals[:] = -1
    np.testing.assert_array_equal(A.to_scipy().toarray(), a.toarray())


def test_stored_zeros_are_dropped_as_by_the_kernel():
    a = _scipy_matrix((5, 6), 4)
    a.data[::2] = 0.0  # stored zeros
    want = a.T.tocsr()
    want.eliminate_zeros()
    got = _call(ucf.compile("C(j,i) = A(i,j)", formats={"A": "csr", "C": "csr"}), A=a)
    assert got.nnz == want.nnz
    np.testing.assert_array_equal(got.to_scipy().toarray(), want.toarray())


def test_only_a_default_copy_that_converts_is_relabelled():
    """Read as stored (no conversion to reuse), computed, or scheduled: the kernel runs."""
    a = _scipy_matrix((6, 7), 5)
    cases = [
        ("C(i,j) = A(i,j)", {"A": "csr", "C": "csr"}, None, a.toarray()),
        ("C(j,i) = 2*A(i,j)", {"A": "csr", "C": "csr"}, None, 2 * a.toarray().T),
        ("C(j,i) = A(i,j)", {"A": "csr", "C": "dense"}, None, a.toarray().T),
        ("C(j,i) = A(i,j)", {"A": "csr", "C": "csr"}, "reorder(j,i)", a.toarray().T),
    ]
    for expr, formats, schedule, want in cases:
        k = ucf.compile(expr, formats=formats, schedule=schedule)
        assert RELABELLED not in k.cin, (expr, k.cin)
        np.testing.assert_array_equal(np.asarray(_call(k, A=a).to_numpy()), want)


def test_a_float32_kernel_rounds_as_it_reads():
    a = _scipy_matrix((5, 4), 6) / 3.0
    k = ucf.compile("C(j,i) = A(i,j)", formats={"A": "csr", "C": "csr"}, dtype="float32")
    got = _call(k, A=ucf.from_scipy(a.astype(np.float32)))
    assert got.vals.dtype == np.float32 and RELABELLED in k.cin
    np.testing.assert_array_equal(got.to_numpy(), a.toarray().T.astype(np.float32))


@settings(max_examples=25)
@given(
    st.permutations("ijk"),
    st.sampled_from(["csf", "UUC", "UCC", "coo"]),
    st.sampled_from(["csf", "UCC", "CCC", "coo"]),
    st.tuples(*[st.integers(0, 5)] * 3),
    st.sampled_from(["llvm", "c"]),
)
def test_random_permuted_copies(perm, fa, fc, shape, target):
    """Third-order copies with the modes permuted, any of these layouts in and out,
    with empty extents: whatever the default does, against numpy's transpose."""
    rng = np.random.default_rng(sum(shape))
    a = rand_sparse(rng, shape, 0.4)
    expr = f"C({','.join(perm)}) = A(i,j,k)"
    k = ucf.compile(expr, formats={"A": fa, "C": fc}, target=target)
    got = _call(k, A=ucf.from_numpy(a, format=fa))
    got.validate()
    np.testing.assert_array_equal(got.to_numpy(), np.transpose(a, ["ijk".index(v) for v in perm]))
