"""Sparse element-wise outputs appended in one pass, as scipy adds matrices: arrays
sized for the operands' entries together, rows appended one after the other, trimmed
once. Checked against scipy (values) and the union or intersection of the patterns
(coordinates), on empty rows, disjoint rows and identical patterns, serial and with
rows in parallel (in chunks of their own, ``ucf.lower.row_chunks``), on both CPU
targets."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import TARGETS, rand_sparse, stored_coords

CSR = {"A": "csr", "B": "csr", "C": "csr", "D": "csr"}
ONE_PASS = "appended in one pass"


def patterns(case: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(len(case))
    B = rand_sparse(rng, (23, 31), 0.2, empty_rows=4)
    if case == "disjoint rows":  # each row stored by one operand only
        C = rand_sparse(rng, (23, 31), 0.3, empty_rows=0)
        C[::2], B[1::2] = 0, 0
    elif case == "same pattern":
        C = (B != 0) * rand_sparse(rng, (23, 31), 1.0, empty_rows=0)
    elif case == "empty":
        C = np.zeros_like(B)
    else:
        C = rand_sparse(rng, (23, 31), 0.2, empty_rows=4)
    return B, C, rand_sparse(rng, (23, 31), 0.1, empty_rows=2)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", ["random", "disjoint rows", "same pattern", "empty"])
@pytest.mark.parametrize("schedule", ["reorder(i,j)", "parallelize(i,CPUThread,NoRaces)"])
@pytest.mark.parametrize(
    "expr,value,union",
    [
        ("A(i,j) = B(i,j) + C(i,j)", lambda b, c, d: b + c, True),
        ("A(i,j) = B(i,j) - C(i,j)", lambda b, c, d: b - c, True),
        ("A(i,j) = B(i,j) * C(i,j)", lambda b, c, d: b * c, False),
        ("A(i,j) = B(i,j) + C(i,j) + D(i,j)", lambda b, c, d: b + c + d, True),
    ],
)
def test_sparse_elementwise_against_scipy(target, case, schedule, expr, value, union):
    B, C, D = patterns(case)
    names = [t for t in "BCD" if f"{t}(i,j)" in expr]
    ops = {t: sp.csr_matrix(x) for t, x in zip("BCD", (B, C, D), strict=True) if t in names}
    k = ucf.compile(
        expr, formats={t: CSR[t] for t in ["A", *names]}, schedule=schedule, target=target
    )
    got = k(**ops)
    got.validate()
    np.testing.assert_array_equal(got.to_numpy(), value(B, C, D))
    stored = [x != 0 for t, x in zip("BCD", (B, C, D), strict=True) if t in names]
    pattern = np.logical_or.reduce(stored) if union else np.logical_and.reduce(stored)
    assert stored_coords(got) == {tuple(c) for c in np.argwhere(pattern)}
    assert ONE_PASS in k.cin  # parallel rows too, in chunks (ucf.lower.row_chunks)


def test_the_bound_is_not_held_when_half_of_it_is_empty():
    """Two identical patterns fill half the bound: the result owns arrays of its size."""
    rng = np.random.default_rng(5)
    B = sp.csr_matrix(rand_sparse(rng, (200, 300), 0.1))
    formats = {t: "csr" for t in "ABC"}
    k = ucf.compile("A(i,j) = B(i,j) + C(i,j)", formats=formats, schedule="reorder(i,j)")
    got = k(B=B, C=B * 2)
    assert np.array_equal(got.to_numpy(), (B * 3).toarray())
    crd = got.levels[1]["crd"]
    assert crd.base is None and got.vals.base is None and len(crd) == B.nnz


def test_a_dense_term_keeps_two_passes():
    """B + d(j) is stored wherever d is: the operands' entries do not bound it."""
    rng = np.random.default_rng(6)
    B, d = sp.csr_matrix(rand_sparse(rng, (9, 7), 0.3)), rng.random(7)
    k = ucf.compile(
        "A(i,j) = B(i,j) + d(j)", formats={"A": "csr", "B": "csr"}, schedule="reorder(i,j)"
    )
    np.testing.assert_allclose(k(B=B, d=d).to_numpy(), B.toarray() + d)
    assert ONE_PASS not in k.cin


@pytest.mark.parametrize("target", TARGETS)
def test_an_output_with_a_fill_stores_the_zeros_its_operands_leave(target):
    """An output whose fill is 1 stores the 0s where every operand is absent, so the
    operands' entries do not bound it and it keeps the counting pass (found by the
    statement fuzzer: one pass dropped an entry and wrote past the arrays it sized)."""
    rng = np.random.default_rng(34)
    a = np.where(rng.random((6, 7)) < 0.3, rng.integers(1, 5, (6, 7)), 0).astype(float)
    b = np.where(rng.random((6, 7)) < 0.3, rng.integers(1, 5, (6, 7)), 0).astype(float)
    k = ucf.compile(
        "C(i,j) = A(i,j) + B(i,j)", {"A": "csr", "B": "csr", "C": "csr fill=1"}, target=target
    )
    got = k(A=ucf.from_numpy(a, "csr"), B=ucf.from_numpy(b, "csr"))
    np.testing.assert_array_equal(got.to_numpy(), a + b)
    assert got.nnz >= np.count_nonzero(a + b != 1)  # every entry that is not the fill
    v = ucf.compile("X(j) = A(j)", {"A": "C", "X": "C fill=1"}, target=target)
    x = np.array([0.0, 1.0, 3.0, 2.0])
    np.testing.assert_array_equal(v(A=ucf.from_numpy(x, "C")).to_numpy(), x)
