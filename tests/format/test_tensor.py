"""The Tensor's own conversions (``convert``, ``astype``, the array protocol), its
classmethod constructors, and ``as_tensor``'s dispatch, against numpy and scipy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from tests.format.tensor_cases import random_array, stored_rows
from ucf.errors import FormatError, OperandError, UcfError
from ucf.format.construction import from_coo, from_numpy
from ucf.format.format import parse_format
from ucf.format.interop import as_tensor
from ucf.format.tensor import Tensor

# --------------------------------------------------------------------------- conversion


def test_convert_between_all_order3_formats():
    a = random_array((3, 4, 2), seed=11)
    fmts = ["UUU", "CCC", "CSS", "UCU:2,0,1", "CUC:1,2,0", "UCS", "CCU:2,1,0"]
    for src, dst in itertools.product(fmts, fmts):
        t = from_numpy(a, src).convert(dst)
        t.validate()
        assert t.format == parse_format(dst, order=3)
        np.testing.assert_array_equal(t.to_numpy(), a)
        assert t.nnz == stored_rows(a, dst)


def test_convert_noop_and_dtypes():
    t = from_numpy(random_array((4, 4), seed=12), "csr")
    assert t.convert() is t
    assert t.convert("UC") is t
    assert t.astype(np.float64) is t
    t64 = t.convert(index_dtype=np.int64)
    assert t64.index_dtype == np.int64 and t64.levels[1]["crd"].dtype == np.int64
    t64.validate()
    f32 = t.convert(dtype=np.float32)
    assert f32.dtype == np.float32 and np.shares_memory(f32.levels[1]["crd"], t.levels[1]["crd"])
    with pytest.raises(OperandError):
        t.astype(np.complex64)


def test_convert_csr_csc_fast_path():
    a = random_array((6, 7), seed=16)
    for idt in (np.int32, np.int64):
        t = from_numpy(a, "csr", index_dtype=idt)
        c = t.convert("csc", dtype=np.float32)
        c.validate()
        assert str(c.format) == "UC:1,0" and c.index_dtype == idt and c.dtype == np.float32
        np.testing.assert_array_equal(c.to_numpy(), a)
        back = c.convert("csr")
        for k in ("pos", "crd"):
            np.testing.assert_array_equal(back.levels[1][k], t.levels[1][k])
    z = from_coo([[0, 1], [2, 2]], [0.0, 1.0], (3, 3), "csr").convert("csc")
    assert z.nnz == 1


def test_convert_drops_zeros_and_narrowing_overflow():
    t = from_coo([[0, 0], [1, 1]], [0.0, 3.0], (2, 2), "csr")
    assert t.nnz == 2 and t.convert("coo").nnz == 1
    big = 2**31 + 10
    wide = Tensor(
        (big,),
        "C",
        [{"pos": np.array([0, 1], np.int64), "crd": np.array([big - 1], np.int64)}],
        np.ones(1),
    )
    with pytest.raises(FormatError, match="int64"):
        wide.convert(index_dtype=np.int32)
    with pytest.raises(FormatError, match="int64"):
        from_coo([[big - 1]], [1.0], (big,), "C", index_dtype=np.int32)


def test_array_protocol():
    a = random_array((3, 4), seed=13)
    dense = from_numpy(a)
    assert np.shares_memory(np.asarray(dense), dense.vals)
    assert not np.shares_memory(dense.to_numpy(), dense.vals)
    assert np.asarray(dense, dtype=np.float32).dtype == np.float32
    sparse = from_numpy(a, "csr")
    np.testing.assert_array_equal(np.array(sparse), a)
    with pytest.raises(ValueError):
        sparse.__array__(copy=False)


# --------------------------------------------------------------------------- as_tensor


def test_as_tensor_dispatch():
    a = random_array((3, 3), seed=14)
    t = as_tensor(a)
    assert t.format.is_dense
    assert as_tensor(t) is t
    c = as_tensor(t, "csr", dtype=np.float32)
    assert c.format.letters == "UC" and c.dtype == np.float32
    m = sp.csr_array(a)
    s = as_tensor(m)
    assert str(s.format) == "UC" and np.shares_memory(s.vals, m.data)
    assert as_tensor(m, "coo").format.letters == "CS"
    assert as_tensor([[1.0, 0.0], [0.0, 2.0]], "csr").nnz == 2
    with pytest.raises(OperandError, match="operand X: unsupported type dict"):
        as_tensor({}, name="X")
    with pytest.raises(UcfError, match="operand Y"):
        as_tensor(a, "CCC", name="Y")
    with pytest.raises(OperandError, match="operand Z.*bool"):
        as_tensor(True, name="Z")


def test_classmethods():
    a = random_array((2, 3), seed=15)
    np.testing.assert_array_equal(Tensor.from_numpy(a, "csr").to_numpy(), a)
    np.testing.assert_array_equal(Tensor.from_scipy(sp.coo_array(a)).to_numpy(), a)
    coords = np.argwhere(a)
    np.testing.assert_array_equal(
        Tensor.from_coo(coords, a[tuple(coords.T)], a.shape, "coo").to_numpy(), a
    )
    assert Tensor.zeros((2, 3), "csr").nnz == 0
