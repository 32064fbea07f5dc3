"""Co-iterating many sparse operands at one loop (issue 19: compile time exploded).

Three or more sparse operands at one index variable are co-iterated by one
loop with match flags rather than one loop per merge-lattice point, so the
generated code grows linearly with the operands.  Results are checked
against numpy, patterns against the operands' stored entries.
"""

from __future__ import annotations

import numpy as np
import pytest

import ucf
from tests.helpers import TARGETS, nonzero_coords, product_params, rand_sparse, stored_coords

NAMES = "BCDEFG"


def tensors(n, shape, density, seed):
    rng = np.random.default_rng(seed)
    return {x: rand_sparse(rng, shape, density, empty_rows=1) for x in NAMES[:n]}


def stored(a, fmt):
    ind = np.zeros(a.shape, dtype=bool)
    coords, _ = ucf.from_numpy(a, format=fmt).to_coo()
    if len(coords):
        ind[tuple(coords.T)] = True
    return ind


@pytest.mark.parametrize(
    "target,n,fmt,out",
    product_params([3, 4, 6], ["CCC", "UCC", "CUC", "UUC"], ["UUU", "CCC", "UCC"]),
)
def test_sum_of_many_sparse_tensors(target, n, fmt, out):
    arrays = tensors(n, (4, 5, 6), 0.2, n)
    rhs = " + ".join(f"{x}(i,j,k)" for x in arrays)
    formats = {x: fmt for x in arrays} | {"A": out}
    k = ucf.compile(f"A(i,j,k) = {rhs}", formats=formats, target=target)
    got = k(**{x: ucf.from_numpy(a, format=fmt) for x, a in arrays.items()})
    np.testing.assert_array_equal(got.to_numpy(), sum(arrays.values()))
    if out != "UUU":
        union = np.logical_or.reduce([stored(a, fmt) for a in arrays.values()])
        assert stored_coords(got) == nonzero_coords(union)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "expr,reference",
    [
        ("(B(i,j) + C(i,j)) * D(i,j) + E(i,j)", lambda B, C, D, E: (B + C) * D + E),
        ("B(i,j) * C(i,j) * D(i,j) - E(i,j)", lambda B, C, D, E: B * C * D - E),
        (
            "max(B(i,j), C(i,j)) + relu(D(i,j) - E(i,j))",
            lambda B, C, D, E: np.maximum(B, C) + np.maximum(D - E, 0),
        ),
        ("B(i,j) + C(i,j) * (D(i,j) + E(i,j))", lambda B, C, D, E: B + C * (D + E)),
    ],
)
@pytest.mark.parametrize("out", ["UU", "csr", "dcsr"])
def test_mixed_expressions_of_four_sparse_operands(target, expr, reference, out):
    arrays = tensors(4, (9, 8), 0.35, 4)
    formats = {x: "dcsr" for x in arrays} | {"A": out}
    k = ucf.compile(f"A(i,j) = {expr}", formats=formats, target=target)
    got = k(**{x: ucf.from_numpy(a, format="dcsr") for x, a in arrays.items()})
    want = reference(*arrays.values())
    np.testing.assert_array_equal(got.to_numpy(), want)
    if out != "UU":
        assert nonzero_coords(want) <= stored_coords(got)


@pytest.mark.parametrize("target", TARGETS)
def test_sum_of_products_reduced_over_a_shared_variable(target):
    """Three sparse vectors meet at j inside a reduction: y(i) = sum_j (B + C + D) * x."""
    arrays = tensors(3, (6, 7), 0.3, 9)
    x = np.arange(1.0, 8.0)
    k = ucf.compile(
        "y(i) = (B(i,j) + C(i,j) + D(i,j)) * x(j)",
        formats=dict.fromkeys(arrays, "csr"),
        target=target,
    )
    got = k(**{n: ucf.from_numpy(a, format="csr") for n, a in arrays.items()}, x=x)
    np.testing.assert_array_equal(got.to_numpy(), sum(arrays.values()) @ x)


def test_code_grows_linearly_with_the_operands():
    """Six 3-D sparse terms: one loop per level, not one per subset of the operands."""
    sizes = []
    for n in (3, 6):
        rhs = " + ".join(f"{x}(i,j,k)" for x in NAMES[:n])
        formats = dict.fromkeys(NAMES[:n], "CCC") | {"A": "CCC"}
        k = ucf.compile(f"A(i,j,k) = {rhs}", formats=formats, target="c")
        sizes.append(len(k.source.splitlines()))
    assert sizes[1] < 2 * sizes[0], sizes
