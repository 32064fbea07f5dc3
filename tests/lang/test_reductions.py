"""Reduction semantics: each summed variable covers the smallest additive term holding
all of its occurrences, as in TACO (``A(i,j)*x(j) + b(i)`` is ``A @ x + b``).

Every reference is numpy: one ``np.einsum`` per term, written out by hand, on
random data with fixed seeds, over every U/C format combination of the
operands on both CPU targets; where the combinations number in the hundreds, on llvm
each and on c those that hold every pair of two operands' formats (``product_params``),
the rest on c in the slow run. The 192 of a sum of terms with different reductions run
that covering array on llvm too (16 rows, a minute of the suite's CPU less), all of them
in the slow run, as do the 64 of nested parentheses; the tests over two operands'
formats on both targets run a covering array of formats and target by default (every
pair of formats on one target or the other, each format on both), every row in the
slow run.
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

import ucf
from tests.helpers import (
    TARGETS,
    covered,
    nonzero_coords,
    product_params,
    rand_sparse,
    stored_coords,
    uc_combos,
)

SEED = 20261124


def rng_for(*key) -> np.random.Generator:
    return np.random.default_rng([SEED, *(zlib.crc32(str(k).encode()) for k in key)])


def run(expr, formats, target, operands, **kwargs):
    k = ucf.compile(expr, formats=formats, target=target)
    ops = {
        n: ucf.from_numpy(a, format=formats.get(n)) if np.ndim(a) else a
        for n, a in operands.items()
    }
    return k(**ops, **kwargs)


def combos(*orders):
    """Every U/C level string for operands of the given orders."""
    return list(itertools.product(*(uc_combos(n) for n in orders)))


def stored(a, fmt) -> np.ndarray:
    """Where ``from_numpy(a, fmt)`` stores an entry (everywhere for dense levels)."""
    ind = np.zeros(np.shape(a), dtype=bool)
    coords, _ = ucf.from_numpy(a, format=fmt).to_coo()
    if len(coords):
        ind[tuple(coords.T)] = True
    return ind


def assert_equal(result, expected):
    got = result.to_numpy()
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    "target,fa,fx,fz", product_params(uc_combos(2), uc_combos(1), uc_combos(1))
)
def test_gemv_with_scalars(target, fa, fx, fz):
    rng = rng_for("gemv", fa, fx, fz)
    A, x, z = rand_sparse(rng, (7, 5)), rand_sparse(rng, (5,)), rand_sparse(rng, (7,))
    expr = "y(i) = a*A(i,j)*x(j) + c*z(i)"
    got = run(
        expr, {"A": fa, "x": fx, "z": fz}, target, {"a": 2.0, "A": A, "x": x, "c": -3.0, "z": z}
    )
    assert_equal(got, 2.0 * np.einsum("ij,j->i", A, x) - 3.0 * z)


@pytest.mark.parametrize(
    "target,fa,fb,fx", product_params(uc_combos(2), uc_combos(2), uc_combos(1))
)
def test_two_products_summed_over_different_variables(target, fa, fb, fx):
    rng = rng_for("two", fa, fb, fx)
    A, B = rand_sparse(rng, (6, 5)), rand_sparse(rng, (6, 4))
    x, z = rand_sparse(rng, (5,)), rand_sparse(rng, (4,), 1.0)
    expr = "y(i) = A(i,j)*x(j) + B(i,k)*z(k)"
    got = run(expr, {"A": fa, "B": fb, "x": fx}, target, {"A": A, "B": B, "x": x, "z": z})
    assert_equal(got, np.einsum("ij,j->i", A, x) + np.einsum("ik,k->i", B, z))


@pytest.mark.parametrize(
    "target,fb,fc,fy", product_params(uc_combos(2), uc_combos(1), uc_combos(1))
)
def test_row_sums_plus_a_vector(target, fb, fc, fy):
    rng = rng_for("rowsum", fb, fc, fy)
    B, c = rand_sparse(rng, (6, 5), empty_rows=2), rand_sparse(rng, (6,), 0.5)
    got = run("y(i) = B(i,j) + c(i)", {"B": fb, "c": fc, "y": fy}, target, {"B": B, "c": c})
    want = np.einsum("ij->i", B) + c
    assert_equal(got, want)
    if fy == "C":
        # Stored where B has a stored row or c a stored entry: the union of the terms.
        structural = stored(B, fb).any(axis=1) | stored(c, fc)
        assert stored_coords(got) == nonzero_coords(structural)


@pytest.mark.parametrize(
    "target,fa,fb,fc,fs",
    product_params(*(uc_combos(2),) * 3, ["csr", "dcsr", "UU"], every_llvm_row=False),
)
def test_sparse_sum_of_terms_with_different_reductions(target, fa, fb, fc, fs):
    """``S(i,j) = A(i,j) + B(i,k)*C(k,j)``: A plus the product, stored exactly where
    A has an entry or some k meets a stored B(i,k) and C(k,j)."""
    rng = rng_for("sparse-sum", fa, fb, fc, fs)
    A = rand_sparse(rng, (5, 6), 0.3)
    B, C = rand_sparse(rng, (5, 4), 0.3), rand_sparse(rng, (4, 6), 0.3)
    formats = {"A": fa, "B": fb, "C": fc, "S": fs}
    k = ucf.compile("S(i,j) = A(i,j) + B(i,k)*C(k,j)", formats=formats, target=target)
    got = k(
        **{n: ucf.from_numpy(a, format=formats[n]) for n, a in zip("ABC", (A, B, C), strict=True)}
    )
    assert_equal(got, A + np.einsum("ik,kj->ij", B, C))
    if fs == "UU":
        return
    if "converted" in k.cin:
        # A repacked operand stores another set of explicit zeros; the values must be there.
        assert nonzero_coords(got.to_numpy()) <= stored_coords(got)
        return
    product = stored(B, fb).astype(int) @ stored(C, fc).astype(int)
    structural = stored(A, fa) | (product > 0)
    assert stored_coords(got) == nonzero_coords(structural)


@pytest.mark.parametrize("fa,fb,target", covered(uc_combos(2), uc_combos(2), ["llvm", "c"]))
def test_vector_union_of_row_sums(target, fa, fb):
    """A sparse vector output of two terms that each sum over their own variable."""
    rng = rng_for("union", fa, fb)
    A, B = rand_sparse(rng, (8, 3), 0.2, empty_rows=3), rand_sparse(rng, (8, 4), 0.2, empty_rows=3)
    got = run("y(i) = A(i,j) + B(i,k)", {"A": fa, "B": fb, "y": "C"}, target, {"A": A, "B": B})
    assert_equal(got, A.sum(axis=1) + B.sum(axis=1))
    rows = stored(A, fa).any(axis=1) | stored(B, fb).any(axis=1)
    assert stored_coords(got) == nonzero_coords(rows)


@pytest.mark.parametrize(
    "target,fa,fb,fc",
    product_params(uc_combos(2), uc_combos(2), uc_combos(2), every_llvm_row=False),
)
def test_nested_parentheses(target, fa, fb, fc):
    rng = rng_for("nested", fa, fb, fc)
    A, B, C = rand_sparse(rng, (5, 4)), rand_sparse(rng, (5, 4)), rand_sparse(rng, (5, 3))
    x, z, w = rand_sparse(rng, (4,), 1.0), rand_sparse(rng, (3,), 1.0), rand_sparse(rng, (3,))
    expr = "y(i) = ((A(i,j) + B(i,j)) * x(j)) - (C(i,k) * (z(k) + w(k)))"
    ops = {"A": A, "B": B, "C": C, "x": x, "z": z, "w": w}
    got = run(expr, {"A": fa, "B": fb, "C": fc}, target, ops)
    assert_equal(got, np.einsum("ij,j->i", A + B, x) - np.einsum("ik,k->i", C, z + w))


@pytest.mark.parametrize("fb,fc,target", covered(uc_combos(2), uc_combos(1), ["llvm", "c"]))
def test_a_product_of_a_sum_is_summed_as_a_whole(target, fb, fc):
    """j occurs in B and in x, so the whole product is summed: B @ x + c * sum(x)."""
    rng = rng_for("whole", fb, fc)
    B, c, x = rand_sparse(rng, (6, 5)), rand_sparse(rng, (6,)), rand_sparse(rng, (5,))
    got = run("y(i) = (B(i,j) + c(i)) * x(j)", {"B": fb, "c": fc}, target, {"B": B, "c": c, "x": x})
    assert_equal(got, np.einsum("ij,j->i", B, x) + c * np.einsum("j->", x))


@pytest.mark.parametrize("fa,fb,target", covered(uc_combos(2), uc_combos(1), ["llvm", "c"]))
def test_minus_and_unary_minus(target, fa, fb):
    rng = rng_for("minus", fa, fb)
    A, x, b = rand_sparse(rng, (6, 5)), rand_sparse(rng, (5,)), rand_sparse(rng, (6,))
    expr = "y(i) = -A(i,j)*x(j) - (-b(i)) - -(A(i,k))"
    got = run(expr, {"A": fa, "b": fb}, target, {"A": A, "x": x, "b": b})
    assert_equal(got, -np.einsum("ij,j->i", A, x) + b + np.einsum("ik->i", A))


@pytest.mark.parametrize("fx,fw,target", covered(uc_combos(3), uc_combos(2), ["llvm", "c"]))
def test_order_three_term_plus_matrix(target, fx, fw):
    rng = rng_for("ttv", fx, fw)
    X, v, W = rand_sparse(rng, (3, 4, 5)), rand_sparse(rng, (5,), 0.8), rand_sparse(rng, (3, 4))
    got = run(
        "M(i,j) = X(i,j,k) * v(k) + W(i,j)", {"X": fx, "W": fw}, target, {"X": X, "v": v, "W": W}
    )
    assert_equal(got, np.einsum("ijk,k->ij", X, v) + W)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fa", uc_combos(2))
def test_explicit_sum_inside_a_function(target, fa):
    rng = rng_for("relu", fa)
    A, x, b = rand_sparse(rng, (7, 5)), rand_sparse(rng, (5,)), rand_sparse(rng, (7,))
    got = run(
        "y(i) = relu(sum(j, A(i,j)*x(j))) + b(i)", {"A": fa}, target, {"A": A, "x": x, "b": b}
    )
    assert_equal(got, np.maximum(np.einsum("ij,j->i", A, x), 0) + b)


@pytest.mark.parametrize("fa,fb,target", covered(uc_combos(2), uc_combos(2), ["llvm", "c"]))
def test_product_of_two_explicit_sums(target, fa, fb):
    rng = rng_for("sums", fa, fb)
    A, B = rand_sparse(rng, (6, 4)), rand_sparse(rng, (6, 5))
    got = run(
        "y(i) = sum(j, A(i,j)) * sum(k, B(i,k))", {"A": fa, "B": fb}, target, {"A": A, "B": B}
    )
    assert_equal(got, np.einsum("ij->i", A) * np.einsum("ik->i", B))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fb,fc", combos(1, 1))
def test_scalar_output_of_separate_sums(target, fb, fc):
    rng = rng_for("scalar", fb, fc)
    b, c, d = rand_sparse(rng, (6,)), rand_sparse(rng, (6,)), rand_sparse(rng, (4,))
    got = run("a = b(i)*c(i) + d(j)", {"b": fb, "c": fc}, target, {"b": b, "c": c, "d": d})
    assert got.to_numpy() == np.einsum("i,i->", b, c) + np.einsum("j->", d)


@pytest.mark.parametrize("target", TARGETS)
def test_a_nested_sum_is_hoisted_out_of_loops_it_does_not_need(target):
    """sum(k, B(i,k)) depends on i only: computed once per row, before the loop over j."""
    rng = rng_for("hoist", target)
    A, B, x = rand_sparse(rng, (6, 5)), rand_sparse(rng, (6, 4)), rand_sparse(rng, (5,))
    k = ucf.compile("y(i) = sum(k, B(i,k)) * A(i,j) * x(j)", formats={"A": "csr"}, target=target)
    assert "forall(i, where(forall(j, y(i) += sum_k * A(i, j) * x(j)), forall(k" in k.cin
    got = k(A=ucf.from_numpy(A, format="csr"), B=B, x=x)
    assert_equal(got, np.einsum("ik->i", B) * np.einsum("ij,j->i", A, x))


def test_cin_shows_every_reduction():
    k = ucf.compile("y(i) = A(i,j)*x(j) + b(i)", formats={"A": "csr"})
    assert k.cin.splitlines()[0] == (
        "forall(i, where(y(i) = sum_j + b(i), forall(j, sum_j += A(i, j) * x(j))))"
    )
    k = ucf.compile("y(i) = A(i,j)*x(j)", formats={"A": "csr"})
    assert k.cin.splitlines()[0] == "forall(i, forall(j, y(i) += A(i, j) * x(j)))"


@pytest.mark.parametrize(
    "expr,message",
    [
        ("y(i) = sum(i, A(i,j))", "an output variable cannot be summed"),
        ("y(i) = sum(j, A(i,j)) * x(j)", "j is also used outside the sum"),
        ("y(i) = sum(j, A(i,k))", "does not use j"),
        ("y(i) = sum(j, A(i,j)) + sum(j, B(i,j))", "summed by two reductions"),
        ("y(i) = sum(A(i,j))", "sum takes index variables"),
        ("y(i) = sum(A, B(i,j))", "does not use A"),
    ],
)
def test_misused_sum_is_a_parse_error_with_a_caret(expr, message):
    with pytest.raises(ucf.ParseError, match=message) as e:
        ucf.compile(expr)
    assert "^" in str(e.value)


def test_a_loop_order_that_splits_a_nested_sum_from_its_variables_is_refused():
    with pytest.raises(ucf.ScheduleError, match="j is summed in sum"):
        ucf.compile(
            "C(i,k) = A(i,j)*B(j,k) + D(i,k)", formats={"A": "csr"}, schedule="reorder(i,j,k)"
        )
