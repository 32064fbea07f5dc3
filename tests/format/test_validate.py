"""``Tensor.validate``: every storage invariant a kernel relies on, each breach refused
with a FormatError that names the level and what is wrong, and fast on large inputs."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ucf.errors import FormatError, OperandError
from ucf.format.tensor import Tensor


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
