"""The default's gate for ``branchless(k, 4)`` (``ucf.schedule.short_fibers``): the mean
fiber is over the fibers the loop visits (the segments of the walked level: a fiber no
level above stores is not visited, an empty one under a dense level is), and the
gathered operand is counted at the bytes of its values as called. Crafted statistics
for each rule, both ways, then calls whose ``k.cin`` says why."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from ucf import pipeline
from ucf.format.format import parse_format
from ucf.schedule.stats import Stats

TTV = "A(i,j) = B(i,j,k) * c(k)"
DTYPES = ("float32", "float64")
SPMV = "y(i) = A(i,j) * x(j)"


def _branchless(expr: str, formats: dict[str, str], stats: Stats) -> bool:
    """Whether the default's first proposal for ``stats`` (one thread) runs branch-free."""
    fmts = {n: parse_format(f) for n, f in formats.items()}
    first = pipeline.proposals(expr, fmts, stats, threads=1)[0]
    return "branchless" in first.text


@pytest.mark.parametrize(
    ("fibers", "chosen"),
    [
        ({"B": 1_000_000}, True),  # 2.5 entries a stored fiber
        ({"B": 250_000}, False),  # 10 a stored fiber, 2.5 over every (i, j)
        ({}, True),  # not counted: over every (i, j), 2.5
    ],
)
def test_mean_over_the_visited_fibers(fibers, chosen):
    dims = {"i": 1000, "j": 1000, "k": 1000}
    stats = Stats(dims, {"B": 2_500_000}, fibers=fibers, itemsize={"B": 8, "c": 8})
    assert _branchless(TTV, {"B": "CCC"}, stats) is chosen


@pytest.mark.parametrize(("itemsize", "chosen"), [(4, True), (8, False), (None, False)])
def test_gathered_bytes_are_the_values(itemsize, chosen):
    """x of 48k values: 192 KB in float32, under the 256 KB limit; 384 KB in float64, over
    it, as when the call did not say (8 bytes)."""
    rows, cols = 200_000, 48_000
    sizes = {} if itemsize is None else {"A": itemsize, "x": itemsize}
    stats = Stats({"i": rows, "j": cols}, {"A": 2 * rows}, fibers={"A": rows}, itemsize=sizes)
    assert _branchless(SPMV, {"A": "csr"}, stats) is chosen


def test_key_follows_the_gate():
    """Two calls whose entries round to the same power of two, one with fibers of 2.5 and
    one of 3.9: another key, so the second is not given the first one's schedule."""
    short = Stats({"i": 1000, "j": 1000, "k": 1000}, {"B": 2_500_000}, fibers={"B": 1_000_000})
    long = Stats({"i": 1000, "j": 1000, "k": 1000}, {"B": 3_900_000}, fibers={"B": 1_000_000})
    assert short.key(1) != long.key(1)
    wider = Stats({"i": 1000, "j": 1000, "k": 1000}, {"B": 2_500_000}, itemsize={"c": 4})
    assert wider.key(1) != Stats(wider.extents, wider.nnz, itemsize={"c": 8}).key(1)


def _ttv(rng, present: float, mean: float):
    """B 800 x 500 x 400 stored CCC: a fraction ``present`` of its (i, j) fibers, each of
    1 + Poisson(mean - 1) entries."""
    dims = (800, 500, 400)
    n = dims[0] * dims[1]
    lengths = np.where(rng.random(n) < present, 1 + rng.poisson(mean - 1, n), 0)
    fiber = np.repeat(np.arange(n), lengths)
    keys = np.unique(fiber * dims[2] + rng.integers(0, dims[2], fiber.size))
    coords = np.stack(np.unravel_index(keys, dims), axis=1)
    vals = rng.standard_normal(keys.size)
    return coords, vals, dims


@pytest.mark.parametrize(("present", "mean", "chosen"), [(0.3, 2.5, True), (0.3, 9.0, False)])
def test_calls_say_why(present, mean, chosen):
    """30 % of the fibers stored: of 2.5 entries each the default runs them branch-free and
    says so over the fibers visited; of 9 (2.7 over every (i, j)) it keeps the loop. The
    result is numpy's either way."""
    rng = np.random.default_rng(int(mean))
    coords, vals, dims = _ttv(rng, present, mean)
    c = rng.standard_normal(dims[2])
    want = np.zeros(dims[:2])
    np.add.at(want, (coords[:, 0], coords[:, 1]), vals * c[coords[:, 2]])
    k = ucf.compile(TTV, formats={"B": "CCC"})
    got = k(B=ucf.from_coo(coords, vals, dims, format="CCC"), c=c).to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert ("branchless(k, 4)" in k.schedule_used) is chosen, k.cin
    if chosen:
        assert "(over the fibers the loop visits)" in k.cin, k.cin
        assert "takes 3200 bytes" in k.cin, k.cin  # c: 400 float64


def test_float32_call_counts_four_bytes():
    """SpMV in float32 with x of 48k: 192 KB gathered, branch-free (float64: 384 KB, not),
    whichever dtype x is given in."""
    rng = np.random.default_rng(1)
    rows, cols = 150_000, 48_000
    m = sp.random(rows, cols, density=2 / cols, format="csr", random_state=rng)
    # x given in the other dtype: the kernel casts it, and reads the kernel's bytes
    cases = [(d, given, d == "float32") for d in ("float32", "float64") for given in DTYPES]
    for dtype, given, chosen in cases:
        a, x = m.astype(dtype), rng.standard_normal(cols).astype(given)
        k = ucf.compile(SPMV, formats={"A": "csr"}, dtype=dtype)
        got = k(A=ucf.from_scipy(a), x=x).to_numpy()
        tol = 1e-5 if dtype == "float32" else 1e-12
        want = a.astype(np.float64) @ x.astype(dtype).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
        assert ("branchless" in k.schedule_used) is chosen, k.cin
        if chosen:
            assert f"takes {4 * cols} bytes" in k.cin, k.cin


def test_a_converted_operand_counts_the_fibers_the_kernel_walks():
    """A CSR kernel given A as CSC walks a CSR copy of rows of 2 entries: branch-free
    as for A given CSR (counting the CSC's 40 columns of 7500 entries had refused it)."""
    rng = np.random.default_rng(1)
    m = sp.random(150_000, 40, density=2 / 40, format="csr", random_state=rng)
    x = rng.standard_normal(40)
    for given in ("csr", "csc"):
        k = ucf.compile(SPMV, formats={"A": "csr"})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ucf.ConversionWarning)
            got = k(A=ucf.from_scipy(m.asformat(given)), x=x).to_numpy()
        np.testing.assert_allclose(got, m @ x, rtol=1e-12, atol=1e-12)
        assert "branchless" in k.schedule_used, (given, k.cin)
        assert "hold 2.0 entries" in k.cin, k.cin
