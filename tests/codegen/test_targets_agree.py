"""The targets' numeric promise (README.md, docs/design.md): llvm and c agree bit for bit
on every number, infinities and both zeros included, and are NaN at the same elements;
which NaN (its sign and payload) is not promised. Checked on data holding NaNs of both
signs and infinities, in dense and sparse loops, with fills whose sums and products make
NaN of their own (``inf - inf``, ``inf * NaN``)."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

import ucf
from tests.helpers import needs_cc

INF = np.inf
SPECIAL = [INF, -INF, np.nan, -np.nan, 0.0, -0.0, 1.5]
#: Every triple of special values, one a row (or an element).
ROWS = np.array(list(itertools.product(SPECIAL, repeat=3)))
X = np.array([2.0, -0.0, -INF])

CASES = [
    ("y(i) = A(i,j) * x(j)", {}),
    ("y(i) = A(i,j) * x(j)", {"A": "csr"}),
    ("y(i) = A(i,j) * x(j) + A(i,j)", {}),
    ("y(i) = max(j, A(i,j))", {"A": "csr"}),
    ("Y(i,j) = x(j) - A(i,j)", {"A": "csr"}),
    ("y(i) = B(i) * C(i) + D(i)", {}),
    ("y(i) = B(i) * C(i)", {"B": "C:0 fill=inf", "C": "C:0 fill=-inf"}),
    ("y(i) = D(i) - B(i) * C(i)", {"B": "C:0 fill=inf", "C": "C:0 fill=inf"}),
    ("y(i) = (B(i) - C(i)) + D(i)", {"B": "C:0 fill=inf", "C": "C:0 fill=inf"}),
]


@needs_cc
@pytest.mark.parametrize(("expr", "formats"), CASES)
def test_llvm_and_c_agree_on_every_number_and_where_nan_is(expr, formats):
    operands = {"A": ROWS, "x": X, "B": ROWS[:, 0], "C": ROWS[:, 1], "D": ROWS[:, 2]}
    got = []
    for target in ("llvm", "c"):
        k = ucf.compile(expr, formats, target=target)
        ops = {
            n: ucf.from_numpy(a, format=formats.get(n))
            for n, a in operands.items()
            if re.search(rf"\b{n}\(", expr)
        }
        got.append(np.atleast_1d(k(**ops).to_numpy()))
    llvm, c = got
    nan = np.isnan(llvm)
    np.testing.assert_array_equal(nan, np.isnan(c))
    assert not nan.all()  # numbers to compare
    np.testing.assert_array_equal(llvm[~nan].view(np.uint64), c[~nan].view(np.uint64))
