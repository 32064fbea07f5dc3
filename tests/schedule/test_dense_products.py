"""The default schedule of products of dense operands (``ucf.schedule.dense_products``):
dense GEMM blocked so the register tiles run it, against numpy, on shapes that leave
remainders of every loop (rows past the last group of 4, columns past the last tile, a
last partial block of ``k``) and empty ones, in float and integer types, on llvm and
c, on one thread and two; bit for bit the plain nest's result; under ASan on the C
target; and the statements it must leave alone."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from tests.asan import run_under_asan
from tests.helpers import TARGETS, rand_dense

GEMM = "C(i,j) = A(i,k) * B(k,j)"
BLOCKED = "dense product blocked as a GEMM"
TILES = "registers: C is accumulated over k1 in tiles of 4 rows (i1)"

# (rows, reduction, columns): 1s, 7s and 33s (short of a tile and past one); a last
# partial block of k (70 = 64 + 6) with a column remainder after whole tiles; empty.
SHAPES = [(1, 1, 1), (7, 7, 7), (33, 33, 33), (37, 70, 53), (0, 5, 3), (5, 0, 3), (4, 3, 0)]


def _operands(rng, m, k, n, dtype):
    return rand_dense(rng, (m, k), dtype), rand_dense(rng, (k, n), dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_gemm_default_matches_numpy(target, dtype, threads):
    rng = np.random.default_rng(3)
    k = ucf.compile(GEMM, dtype=np.dtype(dtype).name, target=target)
    for m, r, n in SHAPES:
        a, b = _operands(rng, m, r, n, dtype)
        got = np.asarray(k(A=a, B=b))
        assert got.shape == (m, n)
        np.testing.assert_array_equal(got, a @ b)
    assert BLOCKED in k.cin


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_default_is_the_plain_nest_bit_for_bit(dtype):
    """Random (inexact) values: the blocked kernel sums each element's terms in k's order,
    one fused multiply-add each, as the plain nest does, on both targets; and a call
    large enough for a plan of its own (``cpu_model.REPLAN_WORK``) takes the blocked
    one, with its tiles."""
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((150, 130)).astype(dtype), rng.random((130, 70)).astype(dtype)
    name = np.dtype(dtype).name
    plain = ucf.compile(GEMM, dtype=name, schedule="reorder(i,k,j)")(A=a, B=b)
    for target in ("llvm", "c"):
        k = ucf.compile(GEMM, dtype=name, target=target)
        got = k(A=a, B=b)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(plain))
        assert BLOCKED in k.cin and TILES in k.cin, k.cin
    np.testing.assert_allclose(np.asarray(got), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_batched_gemm_matches_numpy():
    rng = np.random.default_rng(9)
    a, b = rand_dense(rng, (3, 9, 70)), rand_dense(rng, (3, 70, 35))
    k = ucf.compile("C(b,i,j) = A(b,i,k) * B(b,k,j)")
    np.testing.assert_array_equal(np.asarray(k(A=a, B=b)), a @ b)
    assert BLOCKED in k.cin


@pytest.mark.parametrize(
    ("expr", "formats"),
    [
        (GEMM, {"A": "csr"}),  # SpMM keeps its own default
        ("C(i,j) = A(i,k) * B(j,k)", {}),  # j is not B's unit stride
        (GEMM, {"C": "UU:1,0"}),  # nor the (column-major) output's
        ("y(i) = A(i,j) * x(j)", {}),  # no output loop inside the reduction
        ("C(i,j) = A(i,k) * B(k,j) + D(i,j)", {}),  # not a product alone
    ],
)
def test_other_statements_keep_their_default(expr, formats):
    k = ucf.compile(expr, formats=formats)
    assert BLOCKED not in k.cin
    if "C" in formats:  # refused, yet the answer must stand
        rng = np.random.default_rng(8)
        a, b = rng.standard_normal((37, 70)), rng.standard_normal((70, 53))
        np.testing.assert_allclose(np.asarray(k(A=a, B=b)), a @ b, rtol=1e-12, atol=1e-12)


@settings(max_examples=15)
@given(
    st.integers(0, 40),
    st.integers(0, 80),
    st.integers(0, 40),
    st.sampled_from(["float32", "float64"]),
)
def test_gemm_shapes_fuzzed(m, r, n, dtype):
    rng = np.random.default_rng(m * 10007 + r * 101 + n)
    a, b = _operands(rng, m, r, n, dtype)
    got = np.asarray(ucf.compile(GEMM, dtype=dtype)(A=a, B=b))
    np.testing.assert_array_equal(got, a @ b)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gemm_tiles_stay_in_bounds_under_asan(asan_cc, tmp_path, dtype):
    """Exactly sized buffers: tiles of rows, columns and a block of k that each leave a
    remainder (37 rows: 9 groups of 4 and 1; 53 columns; k = 70: 64 and 6)."""
    rng = np.random.default_rng(11)
    a, b = _operands(rng, 37, 70, 53, dtype)
    k = ucf.compile(GEMM, dtype=dtype, target="c")
    assert TILES in k.cin
    ops = {"A": ucf.from_numpy(a, dtype=dtype), "B": ucf.from_numpy(b, dtype=dtype)}
    out = run_under_asan(asan_cc, tmp_path, k, "UU", (37, 53), {"i": 37, "k": 70, "j": 53}, ops)
    np.testing.assert_array_equal(out.to_numpy(), a @ b)


def test_an_output_narrower_than_a_tile_keeps_the_plain_nest():
    """A call large enough for a plan of its own whose 8 columns fill no tile: the
    blocked nest without tiles would be slower than the plain one."""
    rng = np.random.default_rng(2)
    a, b = _operands(rng, 400, 100, 8, np.float64)
    k = ucf.compile(GEMM)
    np.testing.assert_array_equal(np.asarray(k(A=a, B=b)), a @ b)
    assert BLOCKED not in k.cin
    a, b = _operands(rng, 400, 100, 40, np.float64)
    np.testing.assert_array_equal(np.asarray(k(A=a, B=b)), a @ b)
    assert BLOCKED in k.cin
