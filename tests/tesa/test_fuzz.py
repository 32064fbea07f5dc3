"""Differential fuzzing of the TeSA storage formats against numpy.

Random statements read a matrix A stored blocked (``bcsr``, ``bcsc``, ``bdcsr``) or at
a fixed width (``ell``, ``nm``), on the left or the right of a product, with extents
the blocks and groups do not divide, empty rows and all-zero matrices, under the
default schedule: so the passes that rewrite those kernels (register tiles, packed
panels, row groups) meet shapes their own tests did not choose. Values are small
integers, so every result is exact in float32 and float64 whatever the order of the
sums, and numpy's is the reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from tests.helpers import EXPLORE, TARGETS

# statement, the reference on dense arrays, and the shapes of the other operands from
# A's (m, n) and a third extent p.
STATEMENTS = {
    "spmv": ("y(i) = A(i,j) * x(j)", lambda a, o: a @ o["x"], lambda m, n, p: {"x": (n,)}),
    "spmv_t": ("y(j) = A(i,j) * x(i)", lambda a, o: a.T @ o["x"], lambda m, n, p: {"x": (m,)}),
    "spmm": (
        "C(i,k) = A(i,j) * B(j,k)",
        lambda a, o: a @ o["B"],
        lambda m, n, p: {"B": (n, p)},
    ),
    "right": (
        "C(t,j) = X(t,i) * A(i,j)",
        lambda a, o: o["X"] @ a,
        lambda m, n, p: {"X": (p, m)},
    ),
    "bias": (
        "y(i) = A(i,j) * x(j) + b(i)",
        lambda a, o: a @ o["x"] + o["b"],
        lambda m, n, p: {"x": (n,), "b": (m,)},
    ),
    "sddmm": (
        "S(i,j) = A(i,j) * U(i,k) * V(k,j)",
        lambda a, o: a * (o["U"] @ o["V"]),
        lambda m, n, p: {"U": (m, p), "V": (p, n)},
    ),
    "add": ("S(i,j) = A(i,j) + D(i,j)", lambda a, o: a + o["D"], lambda m, n, p: {"D": (m, n)}),
    "sum": ("z = A(i,j) * Q(i,j)", lambda a, o: np.sum(a * o["Q"]), lambda m, n, p: {"Q": (m, n)}),
}


@st.composite
def formats(draw) -> str:
    kind = draw(st.sampled_from(["bcsr", "bcsc", "bdcsr", "ell", "nm"]))
    if kind == "ell":
        return f"ell({draw(st.integers(1, 5))})"
    if kind == "nm":
        m = draw(st.sampled_from([2, 4, 8]))
        return f"nm({draw(st.integers(1, m))},{m})"
    return f"{kind}({draw(st.sampled_from([1, 2, 3, 4, 8, 32]))},{draw(st.integers(1, 6))})"


def matrix(rng: np.random.Generator, fmt: str, m: int, n: int, density: float) -> np.ndarray:
    """Integer values where ``fmt`` can hold them: at most w per row for ``ell(w)``, n in
    every group of m for ``nm(n,m)``, anywhere in a blocked format."""
    keep = rng.random((m, n)) < density
    params = [int(x) for x in fmt[fmt.index("(") + 1 : -1].split(",")]
    if fmt.startswith("ell"):
        for row in keep:
            row[np.flatnonzero(row)[params[0] :]] = False
    elif fmt.startswith("nm"):
        for row in keep:
            for g in range(0, n, params[1]):
                row[g + np.flatnonzero(row[g : g + params[1]])[params[0] :]] = False
    vals = rng.integers(1, 6, size=(m, n)) * rng.choice([-1, 1], size=(m, n))
    return np.where(keep, vals, 0)


@st.composite
def cases(draw):
    name = draw(st.sampled_from(sorted(STATEMENTS)))
    fmt = draw(formats())
    m, n, p = draw(st.integers(1, 13)), draw(st.integers(1, 40)), draw(st.integers(1, 40))
    density = draw(st.sampled_from([0.0, 0.2, 0.6, 1.0]))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    seed = draw(st.integers(0, 2**16))
    return name, fmt, (m, n, p), density, dtype, seed


def check(target: str, case) -> None:
    name, fmt, (m, n, p), density, dtype, seed = case
    expr, reference, others = STATEMENTS[name]
    rng = np.random.default_rng(seed)
    a = matrix(rng, fmt, m, n, density).astype(dtype)
    operands = {
        k: rng.integers(-5, 6, size=shape).astype(dtype) for k, shape in others(m, n, p).items()
    }
    if fmt.startswith("ell(") and int(fmt[4:-1]) > n:  # w distinct columns of n
        with pytest.raises(ucf.FormatError, match="exceeds the level's dimension"):
            ucf.from_numpy(a, format=fmt)
        return
    k = ucf.compile(expr, formats={"A": fmt}, target=target, dtype=dtype)
    got = k(A=ucf.from_numpy(a, format=fmt), **operands).to_numpy()
    expected = reference(a, operands)
    np.testing.assert_array_equal(got, expected, err_msg=f"{expr} with A {fmt}, {case}")


@pytest.mark.parametrize("target", TARGETS)
@settings(max_examples=12)
@given(case=cases())
def test_tesa_formats_against_numpy(target, case):
    check(target, case)


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@settings(EXPLORE, max_examples=400)
@given(case=cases())
def test_tesa_formats_against_numpy_long(target, case):
    check(target, case)
