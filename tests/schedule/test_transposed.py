"""Products with a transposed operand (``A.T@B``, ``A@B.T``, ``A.T@B.T`` on CSR): the
default reads the transposed operands converted and runs Gustavson's order instead of
co-iterating every output pair (``ucf.schedule.transposed_products``), checked against scipy on
both CPU targets into sparse and dense outputs; the plans of statements whose stored
order fits are not touched."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from tests.helpers import TARGETS, rand_sparse
from ucf import pipeline
from ucf.errors import ScheduleError
from ucf.format.format import parse_format
from ucf.schedule.stats import Stats

# statement, scipy's spelling, A's shape and B's shape as (rows of C, inner, columns of C)
PRODUCTS = {
    "C(i,k) = A(j,i)*B(j,k)": (lambda a, b: a.T @ b, lambda m, r, n: ((r, m), (r, n))),
    "C(i,k) = A(i,j)*B(k,j)": (lambda a, b: a @ b.T, lambda m, r, n: ((m, r), (n, r))),
    "C(i,k) = A(j,i)*B(k,j)": (lambda a, b: a.T @ b.T, lambda m, r, n: ((r, m), (n, r))),
}
MASKED = "C(i,k) = A(i,k)*A(i,j)*B(k,j)"


def operands(expr: str, m: int, r: int, n: int, seed: int = 0):
    """A and B in CSR for ``expr`` with C of ``m`` x ``n`` and a sum over ``r``, with
    empty rows, and an emptied column in each."""
    rng = np.random.default_rng(seed)
    shapes = PRODUCTS[expr][1](m, r, n)
    dense = [rand_sparse(rng, s, 0.15, empty_rows=2) for s in shapes]
    for d in dense:
        d[:, rng.integers(d.shape[1])] = 0
    return [sp.csr_matrix(d) for d in dense]


def as_dense(got) -> np.ndarray:
    return got.to_scipy().toarray() if hasattr(got, "to_scipy") else got.to_numpy()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("out", ["csr", "dense"])
@pytest.mark.parametrize("expr", list(PRODUCTS))
@pytest.mark.parametrize("shape", [(23, 31, 17), (40, 9, 40)])
def test_transposed_products_against_scipy(target, out, expr, shape):
    a, b = operands(expr, *shape)
    k = ucf.compile(expr, formats={"A": "csr", "B": "csr", "C": out}, target=target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)
        got = k(A=a, B=b)
    np.testing.assert_array_equal(as_dense(got), PRODUCTS[expr][0](a, b).toarray())
    assert "loop order i, j, k (default schedule)" in k.cin, k.cin
    assert "converted to the loop order i, j, k" in k.cin, k.cin
    if out == "csr":
        assert "Gustavson's row workspace over k" in k.cin


def test_a_call_says_it_converts():
    a, b = operands("C(i,k) = A(i,j)*B(k,j)", 20, 20, 20)
    k = ucf.compile("C(i,k) = A(i,j)*B(k,j)", formats={"A": "csr", "B": "csr", "C": "csr"})
    with pytest.warns(ucf.ConversionWarning, match="B"):
        k(A=a, B=b)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("out", ["csr", "dense"])
def test_the_masked_product_keeps_its_plan(target, out):
    """A sparse operand over every output variable visits its entries only: no
    conversion, the loop order as before."""
    rng = np.random.default_rng(3)
    a, b = (sp.csr_matrix(rand_sparse(rng, (30, 30), 0.2)) for _ in range(2))
    k = ucf.compile(MASKED, formats={"A": "csr", "B": "csr", "C": out}, target=target)
    got = k(A=a, B=b)
    np.testing.assert_array_equal(as_dense(got), a.multiply(a @ b.T).toarray())
    assert "loop order i, k, j" in k.cin and "converted" not in k.cin


def _first(expr: str, formats: dict, stats: Stats | None):
    fmts = {n: parse_format(f) for n, f in formats.items()}
    return pipeline.proposals(expr, fmts, stats, threads=1)[0]


def test_the_model_compares_the_estimates():
    """With statistics, the linear plan is taken where it is cheaper, and the inner
    products where they are (one output entry: a single pair)."""
    expr, formats = "C(i,k) = A(i,j)*B(k,j)", {"A": "csr", "B": "csr", "C": "csr"}
    big = Stats({"i": 4000, "j": 4000, "k": 4000}, {"A": 40000, "B": 40000})
    chosen = _first(expr, formats, big)
    assert str(chosen.commands[0]) == "convert(B)"
    assert any("about 5.6e+05 steps" in w and "about 3.2e+08 steps" in w for w in chosen.why)
    one = Stats({"i": 1, "j": 4000, "k": 1}, {"A": 10, "B": 10})
    kept = _first(expr, formats, one)
    assert not any(str(c).startswith("convert") for c in kept.commands)
    assert any("co-iterates every (i, k)" in w and "against about" in w for w in kept.why)
    unknown = _first(expr, formats, None)
    assert any("the extents are unknown before a call" in w for w in unknown.why)


@pytest.mark.parametrize(
    "expr,formats",
    [
        ("y(i) = A(i,j)*x(j)", {"A": "csr"}),
        ("y(i) = A(j,i)*x(j)", {"A": "csr"}),
        ("C(i,j) = A(i,k)*B(k,j)", {"A": "csr"}),
        ("C(i,j) = A(k,i)*B(k,j)", {"A": "csr"}),
        ("C(i,k) = A(i,j)*B(k,j)", {"B": "csr"}),  # dense @ sparse.T: a dot per entry
        ("C(i,j) = A(i,k)*B(k,j)", {"A": "csr", "B": "csr", "C": "csr"}),
        ("C(i,j) = A(i,k)*B(k,j)", {"A": "csr", "B": "csr"}),
        ("C(i,j) = A(i,k)*B(k,j)", {"A": "csc", "B": "csc", "C": "csc"}),
        ("C(i,j) = S(i,j)*A(i,k)*B(j,k)", {"S": "csr", "C": "csr"}),
        (MASKED, {"A": "csr", "B": "csr", "C": "csr"}),
        ("A(i,j) = B(i,k,l)*C(k,j)*D(l,j)", {"B": "csf"}),
    ],
)
def test_fitting_plans_are_unchanged(expr, formats):
    """Statements whose stored order fits get no conversion, no reorder and no reason of
    the transposed plan. (Their C source and k.cin, with those of 250 fuzz-drawn
    statements, were compared byte for byte with main's: identical, but for the sums
    distributed over terms that read different sparse operands.)"""
    stats = Stats({v: 300 for v in "ijkl"}, {n: 3000 for n in "ABS"})
    for known in (None, stats):
        chosen = _first(expr, formats, known)
        assert not any(str(c).startswith("convert") for c in chosen.commands)
        assert not any("converted to the loop order" in w for w in chosen.why)
        assert not any("fibers over" in w or "across its rows" in w for w in chosen.why)
        assert not any(str(c).startswith("reorder") for c in chosen.commands)


@pytest.mark.parametrize("target", TARGETS)
def test_convert_in_a_schedule(target):
    """``convert(B)`` lets a user's order walk B against its storage (a copy converted
    per call); the default's schedule text compiles to the kernel it names."""
    expr = "C(i,k) = A(i,j)*B(k,j)"
    formats = {"A": "csr", "B": "csr", "C": "csr"}
    a, b = operands(expr, 15, 12, 19, seed=5)
    schedule = "convert(B); reorder(i,j,k); precompute(A(i,j)*B(k,j), k, k, w)"
    k = ucf.compile(expr, formats=formats, schedule=schedule, target=target)
    with pytest.warns(ucf.ConversionWarning):
        got = k(A=a, B=b)
    np.testing.assert_array_equal(as_dense(got), (a @ b.T).toarray())
    default = ucf.compile(expr, formats=formats, target=target)
    again = ucf.compile(expr, formats=formats, schedule=default.schedule_used, target=target)
    assert again.source == default.source
    with pytest.raises(ScheduleError, match="reorder"):
        ucf.compile(expr, formats=formats, schedule="reorder(i,j,k)", target=target)
    with pytest.raises(ScheduleError, match="Z is not an operand"):
        ucf.compile(expr, formats=formats, schedule="convert(Z)", target=target)
    with pytest.raises(ScheduleError, match="B is converted already"):
        ucf.compile(expr, formats=formats, schedule="convert(B); convert(B)", target=target)
    with pytest.raises(ScheduleError, match="walk dense operand x .* in its storage order"):
        ucf.compile("y(i) = A(i,j)*x(j)", formats={"A": "csr"}, schedule="convert(x)")


SPMVS = "y(i) = A(i,j)*x(j) + B(i,j)*x(j)"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "expr,distributed",
    [
        (SPMVS, True),
        ("y(i) = A(i,j)*x(j) - B(i,j)*z(j)", True),
        ("y(i) = sum(j, A(i,j)*x(j) + B(i,j)*x(j))", True),
        ("y(i) = (A(i,j) + B(i,j))*x(j)", False),  # the user's factoring: left alone
        ("y(i) = A(i,j)*x(j) + A(i,j)*z(j)", False),  # one sparse operand: nothing merged
    ],
)
def test_a_sum_over_terms_of_different_operands_is_distributed(target, expr, distributed):
    rng = np.random.default_rng(7)
    a = sp.csr_matrix(rand_sparse(rng, (29, 41), 0.2, empty_rows=4))
    b = sp.csr_matrix(rand_sparse(rng, (29, 41), 0.2, empty_rows=4))
    b = sp.csr_matrix(b.multiply(np.arange(41) != 5))  # an empty column
    x, z = rng.integers(1, 9, 41).astype(float), rng.integers(1, 9, 41).astype(float)
    ops = {"A": a, "B": b, "x": x, "z": z}
    ops = {n: o for n, o in ops.items() if f"{n}(" in expr}
    formats = {n: "csr" for n in "AB" if n in ops}
    k = ucf.compile(expr, formats=formats, target=target)
    got = k(**ops).to_numpy()
    want = {
        SPMVS: lambda: a @ x + b @ x,
        "y(i) = A(i,j)*x(j) - B(i,j)*z(j)": lambda: a @ x - b @ z,
        "y(i) = sum(j, A(i,j)*x(j) + B(i,j)*x(j))": lambda: a @ x + b @ x,
        "y(i) = (A(i,j) + B(i,j))*x(j)": lambda: (a + b) @ x,
        "y(i) = A(i,j)*x(j) + A(i,j)*z(j)": lambda: a @ x + a @ z,
    }[expr]()
    np.testing.assert_array_equal(got, want)
    assert ("distributed over the terms" in k.cin) == distributed, k.cin


def test_distributing_compares_the_estimates():
    """Rows of about one entry: the workspaces cost what the merge saves, so the terms
    stay co-iterated, and k.cin says why."""
    formats = {"A": "csr", "B": "csr"}
    dense_rows = Stats({"i": 20000, "j": 20000}, {"A": 200000, "B": 200000})
    chosen = _first(SPMVS, formats, dense_rows)
    assert [str(c).split("(")[0] for c in chosen.commands[:2]] == ["precompute"] * 2
    assert any("about 4.4e+05 steps" in w and "about 8e+05" in w for w in chosen.why)
    sparse_rows = Stats({"i": 20000, "j": 20000}, {"A": 20000, "B": 20000})
    kept = _first(SPMVS, formats, sparse_rows)
    assert not any(str(c).startswith("precompute") for c in kept.commands)
    assert any("co-iterating A and B, about" in w for w in kept.why)


@settings(max_examples=15)
@given(
    st.permutations("ij"),
    st.permutations("jk"),
    st.sampled_from(["csr", "csc", "dcsr", "dense"]),
    st.sampled_from(["csr", "csc", "dcsr"]),
    st.sampled_from(["csr", "csc", "dense"]),
    st.tuples(*[st.integers(0, 6)] * 3),
    st.sampled_from(["llvm", "c"]),
)
def test_random_transposed_products(ia, jb, fa, fb, out, shape, target):
    """Products of two matrices, each read in either index order and stored in any of
    these formats, into any of these outputs, with empty extents: the default's plan
    (whatever it converts) against numpy."""
    extents = dict(zip("ijk", shape, strict=True))
    rng = np.random.default_rng(sum(shape))
    a = rand_sparse(rng, [extents[v] for v in ia], 0.4)
    b = rand_sparse(rng, [extents[v] for v in jb], 0.4)
    expr = f"C(i,k) = A({','.join(ia)})*B({','.join(jb)})"
    formats = {"B": fb, "C": out, **({} if fa == "dense" else {"A": fa})}
    k = ucf.compile(expr, formats=formats, target=target)
    ops = {"A": ucf.from_numpy(a, format=fa), "B": ucf.from_numpy(b, format=fb)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)
        got = k(shapes=extents, **ops).to_numpy()
    want = np.einsum(f"{''.join(ia)},{''.join(jb)}->ik", a, b)
    np.testing.assert_array_equal(got, want)
