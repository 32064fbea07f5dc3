"""Tensor packing, unpacking, validation and conversion against numpy/scipy references."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
import scipy.sparse as sp

from ucf.errors import FormatError, OperandError, ShapeError, UcfError
from ucf.format.construction import from_coo, from_numpy, zeros
from ucf.format.format import parse_format
from ucf.format.interop import as_tensor
from ucf.format.scipy_layouts import from_scipy
from ucf.format.tensor import Tensor

VALUE_DTYPES = [np.float64, np.float32, np.int64, np.int32]


def valid_formats(order: int) -> list[str]:
    """Every U/C/S combination the format parser accepts, under every mode ordering."""
    out = []
    for letters in itertools.product("UCS", repeat=order):
        for perm in itertools.permutations(range(order)):
            text = "".join(letters) + ":" + ",".join(map(str, perm))
            try:
                parse_format(text, order=order)
            except FormatError:
                continue
            out.append(text)
    return out


def random_array(shape, density=0.4, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 10, size=shape).astype(dtype)
    a[rng.random(shape) >= density] = 0
    return a


def stored_rows(a: np.ndarray, fmt) -> int:
    """Reference count of stored positions: a sparse level keeps a prefix iff its subtree has a
    nonzero, and U levels below it are stored in full."""
    fmt = parse_format(fmt, order=a.ndim)
    t = np.transpose(a, fmt.mode_order)
    count = 1
    for lvl, kind in enumerate(fmt.levels):
        if kind.letter == "U":
            count *= t.shape[lvl]
        else:
            prefix = np.any(t != 0, axis=tuple(range(lvl + 1, t.ndim)))
            count = int(np.count_nonzero(prefix))
    return count


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


# --------------------------------------------------------------------------- scipy


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


# --------------------------------------------------------------------------- validate


def csr_parts():
    pos = np.array([0, 2, 2, 4], dtype=np.int32)
    crd = np.array([0, 3, 1, 2], dtype=np.int32)
    return pos, crd, np.arange(1.0, 5.0)


def coo_parts():
    pos = np.array([0, 4], dtype=np.int32)
    rows = np.array([0, 0, 2, 2], dtype=np.int32)
    cols = np.array([1, 3, 0, 2], dtype=np.int32)
    return pos, rows, cols, np.arange(1.0, 5.0)


def test_valid_constructions_pass():
    pos, crd, vals = csr_parts()
    Tensor((3, 4), "csr", [{}, {"pos": pos, "crd": crd}], vals)
    pos, rows, cols, vals = coo_parts()
    t = Tensor((3, 4), "coo", [{"pos": pos, "crd": rows}, {"crd": cols}], vals)
    assert t.index_dtype == np.int32
    assert repr(t).splitlines() == [
        "Tensor(shape=(3, 4), format='coo', dtype=float64, nnz=4)",
        "  level 0 C  mode 0  pos=[0 4]  crd=[0 0 2 2]",
        "  level 1 S  mode 1  crd=[1 3 0 2]",
        "  vals=[1. 2. 3. 4.]",
    ]


def _csr(pos=None, crd=None, vals=None, extra=None):
    p, c, v = csr_parts()
    lv = {"pos": p if pos is None else pos, "crd": c if crd is None else crd}
    if extra:
        lv.update(extra)
    return Tensor((3, 4), "csr", [{}, lv], v if vals is None else vals)


I32 = np.int32


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(pos=np.array([0, 2, 4], I32)), FormatError, r"level 1 \(compressed, mode 1\).*pos"),
        (dict(pos=np.array([1, 2, 2, 4], I32)), FormatError, r"level 1.*pos\[0\]"),
        (dict(pos=np.array([0, 3, 2, 4], I32)), FormatError, r"level 1.*parent position 1"),
        (dict(crd=np.array([0, 3, 1], I32)), FormatError, r"level 1.*crd has length"),
        (dict(crd=np.array([0, 4, 1, 2], I32)), FormatError, r"level 1.*crd 4 at position 1"),
        (dict(crd=np.array([0, -1, 1, 2], I32)), FormatError, r"level 1.*out of range"),
        (
            dict(crd=np.array([3, 0, 1, 2], I32)),
            FormatError,
            r"level 1 \(compressed, mode 1\): crd not strictly sorted within segment of "
            r"parent position 0 at position 1 \(crd 0 after 3\)",
        ),
        (dict(crd=np.array([0, 3, 2, 2], I32)), FormatError, r"parent position 2 at position 3"),
        (dict(crd=np.array([0, 3, 1, 2], np.int64)), FormatError, r"level 1.*dtype int64"),
        (dict(crd=np.array([0, 0, 3, 0, 1, 0, 2], I32)[::2]), FormatError, "contiguous"),
        (dict(crd=[0, 3, 1, 2]), FormatError, "numpy array"),
        (dict(extra={"idx": np.zeros(1, I32)}), FormatError, "unexpected array"),
        (dict(vals=np.ones(3)), FormatError, "vals has length 3"),
        (dict(vals=np.ones(4, dtype=np.complex128)), OperandError, "complex128"),
        (dict(vals=np.ones((4, 1))), FormatError, "1-D"),
    ],
)
def test_validate_csr_violations(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        _csr(**kwargs)


def test_validate_crossing_segments_is_fine():
    # crd decreases across a segment boundary: allowed
    _csr(crd=np.array([2, 3, 0, 1], I32))


def test_validate_missing_array_and_wrong_level_count():
    pos, crd, vals = csr_parts()
    with pytest.raises(FormatError, match=r"level 1 \(compressed, mode 1\): missing array 'pos'"):
        Tensor((3, 4), "csr", [{}, {"crd": crd}], vals)
    with pytest.raises(FormatError, match="level array dicts"):
        Tensor((3, 4), "csr", [{"pos": pos, "crd": crd}], vals)


@pytest.mark.parametrize(
    "rows,cols,match",
    [
        ([0, 2, 0, 2], [1, 3, 0, 2], r"level 0 \(compressed, mode 0\): crd not sorted"),
        ([0, 0, 2, 2], [3, 1, 0, 2], r"level 1 \(singleton, mode 1\): crd not sorted.*position 1"),
        (
            [0, 0, 2, 2],
            [1, 1, 0, 2],
            r"level 1 \(singleton, mode 1\): duplicate.*positions 0 and 1",
        ),
        ([0, 0, 2, 3], [1, 3, 0, 2], r"level 0.*crd 3 at position 3"),
        ([0, 0, 2, 2], [1, 3, 0, 4], r"level 1 \(singleton, mode 1\): crd 4 at position 3"),
    ],
)
def test_validate_coo_violations(rows, cols, match):
    pos = np.array([0, 4], I32)
    with pytest.raises(FormatError, match=match):
        Tensor(
            (3, 4),
            "coo",
            [{"pos": pos, "crd": np.array(rows, I32)}, {"crd": np.array(cols, I32)}],
            np.ones(4),
        )


def test_validate_singleton_length_and_three_level_runs():
    pos = np.array([0, 2], I32)
    with pytest.raises(FormatError, match=r"level 1 \(singleton, mode 1\): crd has length 3"):
        Tensor(
            (3, 4),
            "CS",
            [{"pos": pos, "crd": np.array([0, 1], I32)}, {"crd": np.array([0, 1, 2], I32)}],
            np.ones(2),
        )
    # CSS: a later S level only matters when the earlier coordinates tie
    lv0 = {"pos": np.array([0, 3], I32), "crd": np.array([0, 0, 1], I32)}
    ok = Tensor(
        (2, 2, 2),
        "CSS",
        [lv0, {"crd": np.array([0, 1, 0], I32)}, {"crd": np.array([1, 0, 0], I32)}],
        np.ones(3),
    )
    np.testing.assert_array_equal(ok.to_numpy()[:, :, :].sum(), 3)
    with pytest.raises(FormatError, match=r"level 2 \(singleton, mode 2\): duplicate"):
        Tensor(
            (2, 2, 2),
            "CSS",
            [lv0, {"crd": np.array([1, 1, 0], I32)}, {"crd": np.array([1, 1, 0], I32)}],
            np.ones(3),
        )
    with pytest.raises(FormatError, match=r"level 2 \(singleton, mode 2\): crd not sorted"):
        Tensor(
            (2, 2, 2),
            "CSS",
            [lv0, {"crd": np.array([1, 1, 0], I32)}, {"crd": np.array([1, 0, 0], I32)}],
            np.ones(3),
        )


def test_validate_mode_order_in_message_and_check_false():
    pos = np.array([0, 1, 1, 1, 1], I32)  # 4 columns
    crd = np.array([5], I32)
    with pytest.raises(FormatError, match=r"level 1 \(compressed, mode 0\): crd 5"):
        Tensor((3, 4), "csc", [{}, {"pos": pos, "crd": crd}], np.ones(1))
    t = Tensor((3, 4), "csc", [{}, {"pos": pos, "crd": crd}], np.ones(1), check=False)
    with pytest.raises(FormatError):
        t.validate()


def test_validate_is_fast_on_large_inputs():
    n, width = 200_000, 20
    pos = (np.arange(n + 1, dtype=np.int64) * width).astype(np.int32)
    crd = np.tile(np.arange(width, dtype=np.int32), n)
    # The process's CPU time, not the wall clock: a loaded machine's time slices taken
    # by others do not count (vectorized checks take ~0.05 s, a Python loop minutes).
    t0 = time.process_time()
    Tensor((n, width), "csr", [{}, {"pos": pos, "crd": crd}], np.ones(n * width))
    assert time.process_time() - t0 < 2.0


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
