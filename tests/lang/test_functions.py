"""Element-wise functions against numpy, on sparse and dense operands.

A function that maps 0 to 0 keeps its operand's sparsity (the kernel walks
the stored entries only, and a sparse output stores exactly those); one that
maps 0 elsewhere makes its result dense over the iteration space, so the
kernel visits every coordinate and never skips an implicit zero.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import scipy.special

import ucf
from tests.helpers import TARGETS, nonzero_coords, rand_sparse, stored_coords
from ucf.toolchain.cuda_build import nvcc_check, nvcc_path

SEED = 7
needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc")

NUMPY = {
    "relu": lambda x: np.maximum(x, 0),
    "abs": np.abs,
    "sign": np.sign,
    "sqrt": np.sqrt,
    "sin": np.sin,
    "tanh": np.tanh,
    "exp": np.exp,
    "cos": np.cos,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}
ZERO_PRESERVING = ["relu", "abs", "sign", "sqrt", "sin", "tanh"]
DENSE_AT_ZERO = ["exp", "cos", "sigmoid"]
EXACT = {"relu", "abs", "sign"}
FORMATS = ["UU", "UC", "CU", "CC", "UC:1,0", "CC:1,0"]


def rng_for(*key) -> np.random.Generator:
    return np.random.default_rng([SEED, *(zlib.crc32(str(k).encode()) for k in key)])


def operand(rng, shape, fn="", density=0.4):
    a = rand_sparse(rng, shape, density, high=4)
    return np.abs(a) if fn == "sqrt" else a


def close(got, want, fn):
    if fn in EXACT:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-14)


def stored(a, fmt) -> set[tuple[int, ...]]:
    return stored_coords(ucf.from_numpy(a, format=fmt))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fa", FORMATS)
@pytest.mark.parametrize("fn", list(NUMPY))
def test_function_of_an_operand(target, fa, fn):
    rng = rng_for("elementwise", fa, fn)
    A = operand(rng, (5, 6), fn)
    k = ucf.compile(f"B(i,j) = {fn}(A(i,j))", formats={"A": fa}, target=target)
    close(k(A=ucf.from_numpy(A, format=fa)).to_numpy(), NUMPY[fn](A), fn)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fa", ["UC", "CC", "CU"])
@pytest.mark.parametrize("fn", list(NUMPY))
def test_sparse_output_keeps_sparsity_only_where_zero_maps_to_zero(target, fa, fn):
    rng = rng_for("pattern", fa, fn)
    A = operand(rng, (5, 6), fn)
    k = ucf.compile(f"S(i,j) = {fn}(A(i,j))", formats={"A": fa, "S": "csr"}, target=target)
    got = k(A=ucf.from_numpy(A, format=fa))
    close(got.to_numpy(), NUMPY[fn](A), fn)
    if fn in ZERO_PRESERVING:
        assert stored_coords(got) == stored(A, fa)
    else:
        assert stored_coords(got) == nonzero_coords(np.ones(A.shape))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fa", FORMATS)
@pytest.mark.parametrize("fn", ["relu", "exp", "cos", "sigmoid", "tanh"])
def test_sum_of_a_function_counts_the_implicit_zeros(target, fa, fn):
    """sum over j of exp(A(i,j)) adds exp(0) = 1 for every implicit zero."""
    rng = rng_for("rowsum", fa, fn)
    A = operand(rng, (6, 5), fn)
    k = ucf.compile(f"y(i) = {fn}(A(i,j))", formats={"A": fa}, target=target)
    close(k(A=ucf.from_numpy(A, format=fa)).to_numpy(), NUMPY[fn](A).sum(axis=1), fn)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fa,fb", [("UC", "UC"), ("CC", "UU"), ("UU", "CC"), ("CC", "CC:1,0")])
@pytest.mark.parametrize("fn", ["max", "min"])
def test_binary_max_min_read_an_absent_operand_as_zero(target, fa, fb, fn):
    rng = rng_for("maxmin", fa, fb, fn)
    A, B = operand(rng, (5, 6), density=0.3), operand(rng, (5, 6), density=0.3)
    formats = {"A": fa, "B": fb, "S": "csr"}
    k = ucf.compile(f"S(i,j) = {fn}(A(i,j), B(i,j))", formats=formats, target=target)
    got = k(A=ucf.from_numpy(A, format=fa), B=ucf.from_numpy(B, format=fb))
    np.testing.assert_array_equal(got.to_numpy(), getattr(np, fn + "imum")(A, B))
    if "converted" not in k.cin:
        assert stored_coords(got) == stored(A, fa) | stored(B, fb)


@pytest.mark.parametrize("target", TARGETS)
def test_function_of_a_sum_and_a_sum_of_functions(target):
    rng = rng_for("mixed", target)
    A, B, x = operand(rng, (6, 5)), operand(rng, (6, 5)), operand(rng, (5,), density=1.0)
    ops = {"A": ucf.from_numpy(A, format="csr"), "B": ucf.from_numpy(B, format="dcsr"), "x": x}
    formats = {"A": "csr", "B": "dcsr"}
    k = ucf.compile("y(i) = relu(A(i,j) - B(i,j)) * x(j)", formats=formats, target=target)
    np.testing.assert_array_equal(k(**ops).to_numpy(), np.maximum(A - B, 0) @ x)
    k = ucf.compile("y(i) = abs(A(i,j)) + sigmoid(B(i,j)*x(j))", formats=formats, target=target)
    want = np.abs(A).sum(axis=1) + NUMPY["sigmoid"](B * x).sum(axis=1)
    np.testing.assert_allclose(k(**ops).to_numpy(), want, rtol=1e-14)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_kernels_take_the_exact_functions(dtype):
    rng = rng_for("int", dtype)
    A = rand_sparse(rng, (5, 6), 0.5, dtype=np.dtype(dtype))
    B = rand_sparse(rng, (5, 6), 0.5, dtype=np.dtype(dtype))
    expr = "S(i,j) = relu(A(i,j)) + abs(B(i,j)) * sign(A(i,j)) + max(A(i,j), B(i,j))"
    k = ucf.compile(expr, formats={"A": "csr", "B": "csr"}, dtype=dtype)
    want = np.maximum(A, 0) + np.abs(B) * np.sign(A) + np.maximum(A, B)
    got = k(A=ucf.from_numpy(A, format="csr"), B=ucf.from_numpy(B, format="csr")).to_numpy()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fn", ["sqrt", "exp", "sigmoid"])
def test_floating_point_function_in_an_integer_kernel_is_refused(fn):
    with pytest.raises(ucf.UnsupportedError, match=f"function {fn} needs a floating-point"):
        ucf.compile(f"y(i) = {fn}(A(i))", dtype="int64")


def test_float32_kernels_use_the_single_precision_functions():
    rng = rng_for("f32")
    A = operand(rng, (4, 5)).astype(np.float32)
    for fn in ["tanh", "exp", "sqrt", "sigmoid"]:
        a = np.abs(A) if fn == "sqrt" else A
        got = ucf.einsum(f"B(i,j) = {fn}(A(i,j))", A=a)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, NUMPY[fn](a), rtol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_erf_and_rsqrt(target, dtype):
    """gelu is torch's exact GELU and maps 0 to 0, as erf does, so a sparse operand's
    output keeps its pattern; rsqrt is 1/sqrt, dense at 0."""
    rng = rng_for("gelu", target, dtype)
    A = operand(rng, (5, 6)).astype(dtype)
    B = (np.abs(operand(rng, (5, 6), density=1.0)) + 0.5).astype(dtype)
    k = ucf.compile(
        "S(i,j) = gelu(A(i,j)) + erf(A(i,j)) * rsqrt(B(i,j))",
        formats={"A": "csr", "S": "csr"},
        target=target,
        dtype=dtype,
    )
    got = k(A=ucf.from_numpy(A, format="csr"), B=B)
    gelu = A / 2 * (1 + scipy.special.erf(A / np.sqrt(2)))
    want = gelu + scipy.special.erf(A) / np.sqrt(B)
    np.testing.assert_allclose(got.to_numpy(), want, rtol=2e-6 if dtype == np.float32 else 1e-14)
    assert stored_coords(got) == stored(A, "csr")


def test_a_function_that_is_dense_at_zero_cannot_walk_positions():
    with pytest.raises(ucf.ScheduleError, match="exp maps 0 to a nonzero"):
        ucf.compile("y(i) = exp(A(i,j))", formats={"A": "csr"}, schedule="pos(j, jp, A)")


def test_functions_run_under_the_cuda_emulator():
    rng = rng_for("cuda")
    A, x, b = operand(rng, (40, 30)), operand(rng, (30,), density=1.0), operand(rng, (40,))
    k = ucf.compile(
        "y(i) = tanh(sum(j, A(i,j) * x(j))) + exp(b(i)) + gelu(b(i))",
        formats={"A": "csr"},
        target="cuda",
        emulate=True,
    )
    got = k(A=ucf.from_numpy(A, format="csr"), x=x, b=b).to_numpy()
    gelu = b / 2 * (1 + scipy.special.erf(b / np.sqrt(2)))
    np.testing.assert_allclose(got, np.tanh(A @ x) + np.exp(b) + gelu, rtol=1e-13)


@needs_nvcc
@pytest.mark.parametrize("dtype", ["float32", pytest.param("float64", marks=pytest.mark.slow)])
def test_function_kernels_compile_with_nvcc(dtype):
    k = ucf.compile(
        "y(i) = sigmoid(sum(j, A(i,j) * x(j))) + tanh(b(i)) * sqrt(abs(b(i))) "
        "+ max(relu(b(i)), exp(-b(i))) - sign(b(i)) * cos(sin(b(i))) + gelu(b(i)) * rsqrt(x(i))",
        formats={"A": "csr"},
        target="cuda",
        dtype=dtype,
    )
    nvcc_check(k.source, "sm_80")
