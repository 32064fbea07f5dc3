"""Packing user data into level storage (``from_numpy``, ``from_coo``, ``zeros``): round
trips in every format against numpy, the level arrays against scipy's CSR and CSC,
duplicates, explicit zeros, edge shapes, and value and index dtypes."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from tests.format.tensor_cases import VALUE_DTYPES, random_array, stored_rows, valid_formats
from ucf.errors import FormatError, OperandError, ShapeError
from ucf.format.construction import from_coo, from_numpy, zeros
from ucf.format.interop import as_tensor
from ucf.format.tensor import Tensor

# --------------------------------------------------------------------------- round trips

ORDER_CASES = [(1, (7,)), (2, (5, 6)), (3, (3, 4, 5))]


@pytest.mark.parametrize(
    "shape,fmt",
    [(shape, f) for order, shape in ORDER_CASES for f in valid_formats(order)],
)
def test_numpy_round_trip_every_format(shape, fmt):
    a = random_array(shape, seed=len(fmt))
    t = from_numpy(a, fmt)
    t.validate()
    assert t.nnz == stored_rows(a, fmt)
    np.testing.assert_array_equal(t.to_numpy(), a)
    np.testing.assert_array_equal(np.asarray(t), a)
    coords, vals = t.to_coo()
    assert coords.dtype == np.int64 and coords.shape == (t.nnz, a.ndim)
    np.testing.assert_array_equal(a[tuple(coords.T)], vals)


@pytest.mark.parametrize(
    "fmt", ["UUCU:0,2,3,1", "CSSS", "CCCC", "UCSU:3,1,0,2", "dense", "coo", "csf", "CUCU:1,0,3,2"]
)
def test_numpy_round_trip_order4(fmt):
    a = random_array((3, 2, 4, 3), density=0.3, seed=4)
    t = from_numpy(a, fmt)
    t.validate()
    assert t.nnz == stored_rows(a, fmt)
    np.testing.assert_array_equal(t.to_numpy(), a)


@pytest.mark.parametrize("order,shape", ORDER_CASES)
def test_from_coo_matches_from_numpy(order, shape):
    a = random_array(shape, seed=order)
    coords = np.argwhere(a)
    rng = np.random.default_rng(1)
    perm = rng.permutation(len(coords))
    for fmt in valid_formats(order):
        t = from_coo(coords[perm], a[tuple(coords.T)][perm], shape, fmt)
        t.validate()
        ref = from_numpy(a, fmt)
        assert t.format == ref.format
        for lt, lr in zip(t.levels, ref.levels, strict=True):
            assert lt.keys() == lr.keys()
            for k in lt:
                np.testing.assert_array_equal(lt[k], lr[k])
        np.testing.assert_array_equal(t.vals, ref.vals)


def test_csr_and_csc_layout_match_scipy():
    a = random_array((6, 5), seed=3)
    t = from_numpy(a, "csr")
    ref = sp.csr_array(a)
    np.testing.assert_array_equal(t.levels[1]["pos"], ref.indptr)
    np.testing.assert_array_equal(t.levels[1]["crd"], ref.indices)
    np.testing.assert_array_equal(t.vals, ref.data)
    t = from_numpy(a, "csc")
    ref = sp.csc_array(a)
    assert str(t.format) == "UC:1,0"
    np.testing.assert_array_equal(t.levels[1]["pos"], ref.indptr)
    np.testing.assert_array_equal(t.levels[1]["crd"], ref.indices)
    np.testing.assert_array_equal(t.vals, ref.data)


def test_coo_and_dense_row_layouts():
    a = np.array([[0, 0, 0], [1, 0, 2], [0, 0, 0], [0, 3, 0]], dtype=np.float64)
    t = from_numpy(a, "coo")
    assert t.format.letters == "CS"
    np.testing.assert_array_equal(t.levels[0]["pos"], [0, 3])
    np.testing.assert_array_equal(t.levels[0]["crd"], [1, 1, 3])
    np.testing.assert_array_equal(t.levels[1]["crd"], [0, 2, 1])
    np.testing.assert_array_equal(t.vals, [1, 2, 3])
    t = from_numpy(a, "CU")  # rows with any nonzero, stored densely
    np.testing.assert_array_equal(t.levels[0]["pos"], [0, 2])
    np.testing.assert_array_equal(t.levels[0]["crd"], [1, 3])
    np.testing.assert_array_equal(t.vals, [1, 0, 2, 0, 3, 0])
    assert t.level_sizes() == [2, 6]
    t = from_numpy(a, "dcsr")
    np.testing.assert_array_equal(t.levels[1]["pos"], [0, 2, 3])
    assert t.level_sizes() == [2, 3]


def test_dense_layout_follows_mode_order():
    a = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    t = from_numpy(a, "UUU:2,0,1")
    np.testing.assert_array_equal(t.vals, np.transpose(a, (2, 0, 1)).ravel())
    assert t.level_sizes() == [4, 8, 24]


# --------------------------------------------------------------------------- from_coo


def test_from_coo_sums_duplicates_unsorted():
    coords = [[2, 1], [0, 0], [2, 1], [1, 3], [0, 0], [2, 1]]
    vals = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    ref = np.zeros((3, 4))
    for (i, j), v in zip(coords, vals, strict=True):
        ref[i, j] += v
    for fmt in ["dense", "csr", "csc", "coo", "dcsr", "CU", "CS:1,0"]:
        t = from_coo(coords, vals, (3, 4), fmt)
        t.validate()
        np.testing.assert_array_equal(t.to_numpy(), ref)
    assert from_coo(coords, vals, (3, 4), "coo").nnz == 3


def test_from_coo_keeps_explicit_zeros_and_defaults():
    t = from_coo([[0, 1], [1, 0]], [0.0, 2.0], (2, 2), "csr")
    assert t.nnz == 2
    np.testing.assert_array_equal(t.vals, [0.0, 2.0])
    d = from_coo([[0, 1], [1, 0]], [1, 2], (2, 2))  # dense by default
    assert d.format.is_dense and d.dtype == np.int64
    inferred = from_coo([[0, 4], [2, 1]], [1.0, 1.0], format="coo")
    assert inferred.shape == (3, 5)


def test_from_coo_does_not_alias_values():
    vals = np.array([1.0, 2.0])
    t = from_coo([[0], [1]], vals, (2,), "C")
    t.vals[0] = 9
    assert vals[0] == 1.0


def test_from_coo_1d_coords_and_order0():
    t = from_coo([3, 1, 3], [1, 2, 3], (5,), "C")
    np.testing.assert_array_equal(t.to_numpy(), [0, 2, 0, 4, 0])
    s = from_coo(np.zeros((2, 0), dtype=np.int64), [1.5, 2.0], ())
    assert s.shape == () and s.vals.tolist() == [3.5]
    assert float(s.to_numpy()) == 3.5


@pytest.mark.parametrize(
    "coords,shape,match",
    [
        ([[0, 0], [1, 4]], (2, 4), "coordinate 4 of mode 1"),
        ([[0, 0], [-1, 0]], (2, 4), "coordinate -1 of mode 0"),
        ([[0, 0], [2, 0]], (2, 4), "coordinate 2 of mode 0"),
    ],
)
def test_from_coo_out_of_range(coords, shape, match):
    with pytest.raises(ShapeError, match=match):
        from_coo(coords, [1.0, 1.0], shape, "csr")


def test_from_coo_bad_arguments():
    with pytest.raises(ShapeError, match="coords must have shape"):
        from_coo([[0, 0, 0]], [1.0], (2, 2), "csr")
    with pytest.raises(ShapeError, match="values"):
        from_coo([[0, 0]], [1.0, 2.0], (2, 2), "csr")
    with pytest.raises(FormatError, match="integers"):
        from_coo([[0.5, 0]], [1.0], (2, 2), "csr")
    with pytest.raises(FormatError, match="levels"):
        from_coo([[0, 0]], [1.0], (2, 2), "CCC")


# --------------------------------------------------------------------------- edge shapes


@pytest.mark.parametrize("fmt", valid_formats(2))
def test_empty_tensor(fmt):
    t = from_coo(np.zeros((0, 2), dtype=np.int64), [], (3, 4), fmt)
    t.validate()
    np.testing.assert_array_equal(t.to_numpy(), np.zeros((3, 4)))
    z = zeros((3, 4), fmt)
    z.validate()
    assert z.nnz == stored_rows(np.zeros((3, 4)), fmt)
    assert from_numpy(np.zeros((3, 4)), fmt).nnz == z.nnz


@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (5, 1), (0, 3), (3, 0), (1, 1, 1)])
def test_small_and_degenerate_shapes(shape):
    a = random_array(shape, density=0.7, seed=2)
    if a.size:
        a.flat[0] = 1
    for fmt in valid_formats(len(shape)):
        t = from_numpy(a, fmt)
        t.validate()
        np.testing.assert_array_equal(t.to_numpy(), a)


def test_scalars():
    t = from_numpy(np.float64(2.5))
    assert t.shape == () and t.order == 0 and t.vals.tolist() == [2.5]
    assert t.level_sizes() == []
    t.validate()
    assert np.asarray(t).shape == ()
    s = as_tensor(3, name="alpha")
    assert s.dtype == np.int64 and s.to_numpy() == 3
    z = zeros((), dtype=np.float32)
    assert z.vals.tolist() == [0.0] and z.dtype == np.float32


# --------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", VALUE_DTYPES)
@pytest.mark.parametrize("idt", [np.int32, np.int64])
def test_value_and_index_dtypes(dtype, idt):
    a = random_array((4, 5, 3), seed=5, dtype=dtype)
    for fmt in ["UUU", "CSS", "UCU:2,0,1", "CCC"]:
        t = from_numpy(a, fmt, index_dtype=idt)
        t.validate()
        assert t.dtype == dtype and t.index_dtype == idt
        for lv in t.levels:
            for arr in lv.values():
                assert arr.dtype == idt and arr.flags.c_contiguous
        out = t.to_numpy()
        assert out.dtype == dtype
        np.testing.assert_array_equal(out, a)
    coords = np.argwhere(a)
    t = from_coo(coords, a[tuple(coords.T)], a.shape, "csf", index_dtype=idt)
    assert t.dtype == dtype and t.index_dtype == idt


@pytest.mark.parametrize("bad", [np.bool_, np.complex128, np.int16, object, np.uint16, np.uint32])
def test_unsupported_value_dtypes(bad):
    a = np.ones((2, 2), dtype=bad)
    with pytest.raises(OperandError, match=str(np.dtype(bad))):
        from_numpy(a)
    with pytest.raises(OperandError, match="operand B"):
        as_tensor(a, name="B")


def test_explicit_dtype_casts_but_not_from_complex():
    t = from_numpy(np.array([True, False, True]), "C", dtype=np.float32)
    assert t.dtype == np.float32 and t.nnz == 2
    with pytest.raises(OperandError, match="complex"):
        from_numpy(np.ones(2, dtype=complex), dtype=np.float64)
    be = np.arange(4, dtype=">f8")
    assert from_numpy(be).dtype == np.float64


def test_bad_index_dtype():
    with pytest.raises(FormatError, match="int16"):
        from_numpy(np.ones((2, 2)), "csr", index_dtype=np.int16)
    with pytest.raises(FormatError, match="index dtype"):
        Tensor((2,), "C", [{"pos": np.array([0, 1]), "crd": np.array([0])}], [1.0], np.float64)
