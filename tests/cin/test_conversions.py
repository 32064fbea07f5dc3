"""Implicit conversions of operands are said once per kernel, at the user's line."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import ucf

A = sp.random(6, 5, density=0.4, format="csr", random_state=0)
X = np.arange(5.0)


def _calls(k, **ops) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        k(**ops)
        k(**ops)
    return [w for w in seen if issubclass(w.category, ucf.ConversionWarning)]


@pytest.mark.parametrize(
    "dtype, ops, words",
    [
        ("float64", {"A": A.toarray(), "x": X}, ["operand A is stored as 'dense'", "reads 'csr'"]),
        ("float32", {"A": A.astype(np.float32), "x": X}, ["operand x has float64 values"]),
        (
            "float64",
            {"A": ucf.from_scipy(A, index_dtype=np.int64), "x": X},
            ["operand A has int64 indices but the kernel reads int32"],
        ),
    ],
)
def test_a_conversion_is_said_once_at_the_users_line(dtype, ops, words):
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, dtype=dtype)
    seen = _calls(k, **ops)
    assert len(seen) == 1, [str(w.message) for w in seen]
    assert seen[0].filename == __file__
    for w in words:
        assert w in str(seen[0].message)
    got = k(**ops).to_numpy()
    np.testing.assert_allclose(got, A @ X, rtol=1e-6)


def test_no_warning_when_nothing_is_converted_or_values_widen():
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"})
    assert _calls(k, A=A, x=X.astype(np.float32)) == []


def test_a_planned_conversion_points_at_the_users_line_through_einsum():
    """CSR plus CSC: no loop order follows both, so one is converted before each call
    (said when the kernel is compiled, here deep inside einsum)."""
    B = sp.random(6, 5, density=0.4, format="csc", random_state=1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        S = ucf.einsum("S(i,j) = A(i,j) + B(i,j)", A=A, B=B)
    conv = [w for w in seen if issubclass(w.category, ucf.ConversionWarning)]
    assert conv and all(w.filename == __file__ for w in conv), [w.filename for w in conv]
    assert "since the kernel's loop order does not follow its format" in str(conv[0].message)
    np.testing.assert_allclose(S, (A + B).toarray())  # a dense output: numpy
