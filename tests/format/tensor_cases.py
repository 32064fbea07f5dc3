"""What the tests of tensors in tests/format share (test_packing.py, test_scipy_layouts.py,
test_tensor.py): every valid format of an order, random integer-valued arrays, and
the count of positions a format stores of an array, computed apart from ucf's packing."""

from __future__ import annotations

import itertools

import numpy as np

from ucf.errors import FormatError
from ucf.format.format import parse_format

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
