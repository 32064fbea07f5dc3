"""Sums of products (``A@B + D@E``): precompute on statements with nested sums, and the
default plan's row workspace, checked against scipy on both CPU targets, into sparse
and dense outputs."""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import TARGETS, rand_sparse
from ucf.errors import ScheduleError

APART = "C(i,j) = A(i,k)*B(k,j) + D(i,l)*E(l,j)"  # one sum per product
SHARED = "C(i,j) = A(i,k)*B(k,j) + D(i,k)*E(k,j)"  # sum(k, A*B + D*E)
MINUS = "C(i,j) = A(i,k)*B(k,j) - D(i,l)*E(l,j)"
CSR = {"A": "csr", "B": "csr", "D": "csr", "E": "csr"}
PAR = "; parallelize(i, CPUThread, NoRaces)"


def operands(seed: int = 0, n: int = 37) -> dict[str, sp.csr_matrix]:
    rng = np.random.default_rng(seed)
    return {t: sp.csr_matrix(rand_sparse(rng, (n, n), 0.08, empty_rows=3)) for t in "ABDE"}


def reference(expr: str, ops: dict) -> np.ndarray:
    second = ops["D"] @ ops["E"]
    return (ops["A"] @ ops["B"] + (-second if " - " in expr else second)).toarray()


def check(expr: str, out: str, schedule: str | None, target: str, seed: int = 0):
    ops = operands(seed)
    k = ucf.compile(expr, formats={**CSR, "C": out}, schedule=schedule, target=target)
    got = k(**ops)
    dense = got.to_scipy().toarray() if out == "csr" else got.to_numpy()
    np.testing.assert_array_equal(dense, reference(expr, ops))
    return k, got


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("out", ["csr", "dense"])
@pytest.mark.parametrize(
    "expr,schedule",
    [
        (APART, "precompute(A(i,k)*B(k,j),j,j,w); precompute(D(i,l)*E(l,j),j,j,v)"),
        (APART, "precompute(A(i,k)*B(k,j) + D(i,l)*E(l,j),j,j,w)" + PAR),
        (SHARED, "precompute(A(i,k)*B(k,j),j,j,w); precompute(D(i,k)*E(k,j),j,j,v)" + PAR),
        (SHARED, "precompute(A(i,k)*B(k,j) + D(i,k)*E(k,j),j,j,w)"),
        (MINUS, "precompute(A(i,k)*B(k,j),j,j,w); precompute(D(i,l)*E(l,j),j,j,v)" + PAR),
        (MINUS, "precompute(A(i,k)*B(k,j) - D(i,l)*E(l,j),j,j,w)"),
        (APART, None),
        (SHARED, None),
    ],
)
def test_sums_of_products_against_scipy(target, out, expr, schedule):
    k, _ = check(expr, out, schedule, target)
    if schedule is None:  # the default does not co-iterate every (i, j) with the sums
        assert "converted" not in k.cin
        if out == "csr" or expr != SHARED:  # a dense C(i, j) += ... needs no workspace
            assert "into one workspace over j" in k.cin and "Gustavson" in k.cin


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("expr", [APART, SHARED, MINUS])
@pytest.mark.parametrize("schedule", [None, "whole", "apart"])
def test_rows_a_compressed_operand_lacks_add_only_the_other_product(target, expr, schedule):
    """A and D in dcsr (their rows compressed) with rows one of them lacks: where the
    loop over i co-iterates them, a row of A's that is absent adds D*E alone, each
    product's producer folded away with its absent operand (it read past A's entries)."""
    ops = operands(2)
    ops["A"][:6] = 0
    ops["D"][4:12] = 0
    for m in ops.values():
        m.eliminate_zeros()
    r = "l" if expr != SHARED else "k"  # the second product's sum
    sign = "-" if expr == MINUS else "+"
    commands = {
        None: None,
        "whole": f"precompute(A(i,k)*B(k,j) {sign} D(i,{r})*E({r},j),j,j,w)",
        "apart": f"precompute(A(i,k)*B(k,j),j,j,w); precompute(D(i,{r})*E({r},j),j,j,v)",
    }[schedule]
    formats = {**CSR, "A": "dcsr", "D": "dcsr", "C": "csr"}
    k = ucf.compile(expr, formats=formats, schedule=commands, target=target)
    got = k(**{n: ucf.from_scipy(m, format=formats[n]) for n, m in ops.items()})
    np.testing.assert_array_equal(got.to_scipy().toarray(), reference(expr, ops))


def test_only_one_product_gathered_leaves_the_other_a_nested_sum(target="llvm"):
    """The other product stays a sum computed for each (i, j) of a dense output."""
    check(APART, "dense", "precompute(A(i,k)*B(k,j),j,j,w)", target)


def test_the_default_says_what_it_chose_against_what():
    ops = operands(1, n=60)
    k = ucf.compile(APART, formats={**CSR, "C": "csr"})
    got = k(**ops)
    np.testing.assert_array_equal(got.to_scipy().toarray(), reference(APART, ops))
    line = next(x for x in k.cin.splitlines() if "Gustavson" in x)
    assert "multiply-adds" in line and "co-iterating every (i, j) of C" in line


@pytest.mark.parametrize(
    "expr,schedule,message",
    [
        (SHARED, "precompute(A(i,k)*B(k,j),j,j,w)", "still sums D(i, k)*E(k, j) over k"),
        (APART, "precompute(A(i,k),j,j,w)", "not a whole term of the sum"),
        (APART, "precompute(A(i,k)*B(k,j) + D(i,l),j,j,w)", "not a whole term of the sum"),
        (MINUS, "precompute(A(i,k)*B(k,j) + D(i,l)*E(l,j),j,j,w)", "subtracts others"),
    ],
)
def test_refused_precomputes_of_sums(expr, schedule, message):
    with pytest.raises(ScheduleError, match=re.escape(message)):
        ucf.compile(expr, formats={**CSR, "C": "csr"}, schedule=schedule)(**operands())


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "schedule",
    [None, "precompute(A(k),k,k,w); precompute(B(i,k,j),k,k,v); precompute(C(j,k,i),k,k,u)"],
)
@pytest.mark.parametrize("formats", [{}, {"A": "C:0", "B": "CCC", "C": "CCC"}])
def test_a_term_without_a_summed_variable_is_added_once_per_value(target, schedule, formats):
    """``X(k) = A(k) + B(i,k,j) + C(j,k,i)`` sums the whole right-hand side over i and j
    (both B and C read them), so A(k) counts n_i * n_j times; its workspace's producer
    must loop over i and j although A reads neither (statement fuzzer, seed 71)."""
    rng = np.random.default_rng(3)
    a = rng.integers(-3, 4, 5).astype(float)
    b, c = (rng.integers(-3, 4, s) * (rng.random(s) < 0.4) for s in [(2, 5, 3), (3, 5, 2)])
    k = ucf.compile(
        "X(k) = A(k) + B(i,k,j) + C(j,k,i)", formats=formats, schedule=schedule, target=target
    )
    ops = {"A": a, "B": b.astype(float), "C": c.astype(float)}
    got = k(**{n: ucf.from_numpy(v, format=formats[n]) if formats else v for n, v in ops.items()})
    want = (
        np.einsum("k,i,j->k", a, np.ones(2), np.ones(3)) + b.sum(axis=(0, 2)) + c.sum(axis=(0, 2))
    )
    np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "schedule",
    [None, "precompute(x(i),i,i,w); precompute(A(i,j)*z(j),i,i,v); precompute(B(i,j)*z(j),i,i,u)"],
)
def test_a_vector_beside_two_spmvs_counts_once_per_column(target, schedule):
    """``y(i) = x(i) + A(i,j)*z(j) + B(i,j)*z(j)``: j is in both products, so the sum over
    j holds x(i) too (docs/language.md), by default and with every term gathered."""
    ops = operands(5)
    x, z = np.arange(37.0), np.linspace(-1, 1, 37)
    k = ucf.compile(
        "y(i) = x(i) + A(i,j)*z(j) + B(i,j)*z(j)",
        formats={"A": "csr", "B": "csr"},
        schedule=schedule,
        target=target,
    )
    got = k(A=ops["A"], B=ops["B"], x=x, z=z)
    np.testing.assert_allclose(got, 37 * x + ops["A"] @ z + ops["B"] @ z, rtol=1e-12)
