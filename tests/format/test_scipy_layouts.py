"""Tensors from and to scipy.sparse (``from_scipy``, ``Tensor.to_scipy``): zero-copy
where the layouts match, copies where dtypes change, scipy's non-canonical and
malformed matrices, and every scipy container, against scipy's own arrays."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from tests.format.tensor_cases import random_array, valid_formats
from ucf.errors import FormatError, OperandError
from ucf.format.construction import from_numpy
from ucf.format.scipy_layouts import from_scipy


@pytest.mark.parametrize("idt", [np.int32, np.int64])
@pytest.mark.parametrize("kind", ["csr", "csc"])
@pytest.mark.parametrize("container", ["array", "matrix"])
def test_from_scipy_zero_copy(idt, kind, container):
    a = random_array((7, 9), seed=6)
    m = getattr(sp, f"{kind}_{container}")(a)
    m.indptr = m.indptr.astype(idt)
    m.indices = m.indices.astype(idt)
    t = from_scipy(m, kind)
    assert t.index_dtype == idt
    lv = t.levels[1]
    assert np.shares_memory(lv["pos"], m.indptr)
    assert np.shares_memory(lv["crd"], m.indices)
    assert np.shares_memory(t.vals, m.data)
    np.testing.assert_array_equal(t.to_numpy(), a)
    back = t.to_scipy()
    assert back.format == kind
    assert np.shares_memory(back.data, m.data)
    if idt == np.int32:
        assert np.shares_memory(back.indices, m.indices)


def test_scipy_csr_with_unsorted_rows_is_uq_in_place():
    """scipy's own product leaves rows unsorted: as ``UQ`` it is read and given back on
    the same arrays; repeated indices (valid scipy, summed) are repacked."""
    a = sp.random(40, 40, density=0.1, format="csr", random_state=3)
    m = a @ a
    assert not m.has_sorted_indices
    t = from_scipy(m, "UQ")
    assert np.shares_memory(t.levels[1]["crd"], m.indices) and np.shares_memory(t.vals, m.data)
    np.testing.assert_array_equal(t.to_numpy(), m.toarray())
    back = t.to_scipy()
    assert np.shares_memory(back.indices, m.indices) and not back.has_sorted_indices
    twice = sp.csr_array((np.ones(3), np.array([2, 2, 0]), np.array([0, 3])), shape=(1, 3))
    t = from_scipy(twice, "UQ")
    assert not np.shares_memory(t.levels[1]["crd"], twice.indices)
    np.testing.assert_array_equal(t.to_numpy(), [[1.0, 0.0, 2.0]])


def test_from_scipy_copies_on_dtype_change():
    m = sp.csr_array(random_array((4, 4), seed=7))
    t = from_scipy(m, index_dtype=np.int64)
    assert t.index_dtype == np.int64 and not np.shares_memory(t.levels[1]["crd"], m.indices)
    assert np.shares_memory(t.vals, m.data)
    t = from_scipy(m, dtype=np.float32)
    assert t.dtype == np.float32 and np.shares_memory(t.levels[1]["crd"], m.indices)


def test_from_scipy_non_canonical_is_not_mutated():
    indptr = np.array([0, 3, 3, 5], dtype=np.int32)
    indices = np.array([2, 0, 2, 1, 0], dtype=np.int32)
    data = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    m = sp.csr_matrix((data, indices, indptr), shape=(3, 4))
    ref = m.toarray()
    saved = (indptr.copy(), indices.copy(), data.copy())
    for fmt in ["csr", "csc", "coo", "dense", "dcsr"]:
        t = from_scipy(m, fmt)
        t.validate()
        np.testing.assert_array_equal(t.to_numpy(), ref)
    assert from_scipy(m).nnz == 4
    for before, after in zip(saved, (m.indptr, m.indices, m.data), strict=True):
        np.testing.assert_array_equal(before, after)


def test_from_scipy_out_of_range_indices():
    m = sp.csr_array(
        (np.ones(2), np.array([0, 7], dtype=np.int32), np.array([0, 1, 2], dtype=np.int32)),
        shape=(2, 3),
    )
    with pytest.raises(FormatError, match="index 7"):
        from_scipy(m)
    with pytest.raises(FormatError, match="index 7"):
        from_scipy(m, "coo")
    bad_ptr = sp.csr_array((2, 3))
    bad_ptr.indptr = np.array([0, 2, 1], dtype=np.int32)
    bad_ptr.indices = np.array([0, 1], dtype=np.int32)
    bad_ptr.data = np.ones(2)
    with pytest.raises(FormatError, match="pos decreases"):
        from_scipy(bad_ptr)
    short = sp.csr_array((2, 3))
    short.indptr = np.array([0, 2, 4], dtype=np.int32)
    with pytest.raises(FormatError, match="indptr"):
        from_scipy(short)


@pytest.mark.parametrize("kind", ["coo", "lil", "dok", "bsr", "dia"])
def test_from_scipy_other_containers(kind):
    a = random_array((6, 4), seed=8)
    m = sp.csr_matrix(a).asformat(kind)
    for fmt in ["csr", "csc", "coo", "CC:1,0", "CU"]:
        t = from_scipy(m, fmt)
        t.validate()
        np.testing.assert_array_equal(t.to_numpy(), a)


def test_from_scipy_rejects_bool_and_non_sparse():
    with pytest.raises(OperandError, match="bool"):
        from_scipy(sp.csr_array(np.eye(2, dtype=bool)))
    with pytest.raises(OperandError):
        from_scipy(np.eye(2))


def test_to_scipy_formats():
    a = random_array((5, 3), seed=9)
    for fmt in valid_formats(2):
        m = from_numpy(a, fmt).to_scipy()
        np.testing.assert_array_equal(m.toarray(), a)
    assert from_numpy(a, "coo").to_scipy().format == "csr"
    assert isinstance(from_numpy(a, "csr").to_scipy(matrix=True), sp.csr_matrix)
    with pytest.raises(FormatError, match="order 3"):
        from_numpy(np.ones((2, 2, 2))).to_scipy()
