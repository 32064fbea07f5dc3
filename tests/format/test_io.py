"""File round trips for every supported suffix, and the errors for bad files."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import scipy.sparse as sp

from ucf.errors import FormatError, OperandError, UcfError
from ucf.format import io
from ucf.format.construction import from_numpy
from ucf.format.tensor import Tensor


def random_array(shape, density=0.4, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    a = (rng.random(shape) * 10).astype(dtype)
    a[rng.random(shape) >= density] = 0
    return a


@pytest.mark.parametrize("suffix", [".mtx", ".mtx.gz", ".tns", ".tns.gz", ".npy", ".npz"])
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "dense"])
def test_matrix_round_trip(tmp_path, suffix, fmt):
    a = random_array((6, 5), seed=1)
    a[-1, -1] = 0  # the .tns shape must survive an empty last row/column
    a[:, -1] = 0
    t = from_numpy(a, fmt)
    path = tmp_path / f"m{suffix}"
    io.write(path, t)
    back = io.read(path)
    assert isinstance(back, Tensor) and back.shape == a.shape
    np.testing.assert_array_equal(back.to_numpy(), a)
    again = io.read(str(path), format="CS:1,0")
    assert str(again.format) == "CS:1,0"
    np.testing.assert_array_equal(again.to_numpy(), a)


def test_default_formats(tmp_path):
    a = random_array((4, 3), seed=2)
    expected = {".mtx": "UC", ".tns": "CC", ".npy": "UU", ".npz": "UC"}
    for suffix, letters in expected.items():
        path = tmp_path / f"x{suffix}"
        io.write(path, from_numpy(a))
        assert str(io.read(path).format) == letters


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.int32])
def test_value_dtypes_survive_binary_formats(tmp_path, dtype):
    a = random_array((5, 4), seed=3).astype(dtype)
    for suffix in (".npy", ".npz"):
        path = tmp_path / f"x{suffix}"
        io.write(path, from_numpy(a, "csr"))
        back = io.read(path)
        assert back.dtype == dtype
        np.testing.assert_array_equal(back.to_numpy(), a)
    path = tmp_path / "x.mtx"
    io.write(path, from_numpy(a, "csr"))
    # Matrix Market has no precision field: float32 comes back as float64 of the same digits
    np.testing.assert_array_equal(io.read(path).to_numpy().astype(dtype), a)


@pytest.mark.parametrize("fmt", ["csf", "coo", "dense", "UCU:2,0,1"])
def test_tns_order3_and_order4(tmp_path, fmt):
    a = random_array((3, 4, 2), seed=4)
    path = tmp_path / "t.tns"
    io.write(path, from_numpy(a, fmt))
    back = io.read(path, fmt)
    np.testing.assert_array_equal(back.to_numpy(), a)
    b = random_array((2, 3, 2, 3), density=0.3, seed=5)
    io.write(path, b)  # plain numpy arrays are accepted too
    np.testing.assert_array_equal(io.read(path).to_numpy(), b)


def test_tns_hand_written_with_comments_and_duplicates(tmp_path):
    path = tmp_path / "h.tns"
    path.write_text("# a FROSTT file\n1 1 1 1.5\n\n2 3 1 -2\n# comment\n2 3 1 0.5\n1 2 4 3e2\n")
    t = io.read(path)
    assert t.shape == (2, 3, 4) and str(t.format) == "CCC"
    ref = np.zeros((2, 3, 4))
    ref[0, 0, 0] = 1.5
    ref[1, 2, 0] = -1.5
    ref[0, 1, 3] = 300
    np.testing.assert_array_equal(t.to_numpy(), ref)


@pytest.mark.parametrize(
    "text,match",
    [
        ("1 1 1.0\n0 2 1.0\n", "1-based"),
        ("1 1.5 1.0\n", "integers"),
        ("1 2 x\n", "FROSTT"),
        ("1 2 3\n1 2\n", "FROSTT"),
        ("# nothing\n", "shape"),
        ("5\n", "coordinate"),
    ],
)
def test_tns_bad_content(tmp_path, text, match):
    path = tmp_path / "bad.tns"
    path.write_text(text)
    with pytest.raises(FormatError, match=match) as info:
        io.read(path)
    assert str(path) in str(info.value)


def test_tns_empty_with_shape_comment(tmp_path):
    path = tmp_path / "e.tns"
    io.write(path, from_numpy(np.zeros((3, 2)), "csr"))
    t = io.read(path)
    assert t.shape == (3, 2) and t.nnz == 0


def test_mtx_symmetric_expands(tmp_path):
    path = tmp_path / "s.mtx"
    path.write_text(
        "%%MatrixMarket matrix coordinate real symmetric\n3 3 3\n1 1 1.0\n3 1 2.0\n3 2 4.0\n"
    )
    t = io.read(path)
    ref = np.array([[1.0, 0, 2.0], [0, 0, 4.0], [2.0, 4.0, 0]])
    np.testing.assert_array_equal(t.to_numpy(), ref)
    assert t.nnz == 5


def test_mtx_gz_and_pattern(tmp_path):
    path = tmp_path / "p.mtx.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("%%MatrixMarket matrix coordinate pattern general\n2 3 2\n1 3\n2 1\n")
    t = io.read(path)
    np.testing.assert_array_equal(t.to_numpy(), [[0, 0, 1], [1, 0, 0]])


def test_npz_keeps_zero_copy_csr(tmp_path):
    path = tmp_path / "z.npz"
    sp.save_npz(path, sp.csr_array(random_array((4, 4), seed=6)))
    t = io.read(path)
    assert str(t.format) == "UC"
    t.validate()


def test_errors_name_the_path(tmp_path):
    with pytest.raises(FormatError, match=r"x\.foo.*unknown file type"):
        io.read(tmp_path / "x.foo")
    with pytest.raises(FormatError, match="unknown file type"):
        io.write(tmp_path / "noext", from_numpy(np.ones(2)))
    with pytest.raises(FormatError, match="unknown file type"):
        io.read(tmp_path / "x.npy.gz")
    missing = tmp_path / "missing.mtx"
    with pytest.raises(OperandError, match="missing.mtx"):
        io.read(missing)
    for name in ("missing.tns", "missing.npy", "missing.npz"):
        with pytest.raises(UcfError, match=name):
            io.read(tmp_path / name)
    garbage = tmp_path / "garbage.npy"
    garbage.write_bytes(b"not numpy")
    with pytest.raises(UcfError, match="garbage.npy"):
        io.read(garbage)
    notsparse = tmp_path / "plain.npz"
    np.savez(notsparse, a=np.ones(3))
    with pytest.raises(UcfError, match="plain.npz"):
        io.read(notsparse)
    badmtx = tmp_path / "bad.mtx"
    badmtx.write_text("hello\n")
    with pytest.raises(UcfError, match="bad.mtx"):
        io.read(badmtx)


def test_write_rejects_wrong_order(tmp_path):
    cube = from_numpy(np.ones((2, 2, 2)))
    for suffix in (".mtx", ".npz"):
        with pytest.raises(FormatError, match="order 3") as info:
            io.write(tmp_path / f"c{suffix}", cube)
        assert f"c{suffix}" in str(info.value)
    with pytest.raises(OperandError, match="nodir"):
        io.write(tmp_path / "nodir" / "x.npy", cube)


def test_npy_scalar_and_vector(tmp_path):
    path = tmp_path / "v.npy"
    io.write(path, from_numpy(np.array([0.0, 2.0, 0.0]), "C"))
    t = io.read(path, "C")
    assert t.nnz == 1 and t.to_numpy().tolist() == [0.0, 2.0, 0.0]
    io.write(path, np.float64(4.0))
    assert io.read(path).to_numpy() == 4.0
