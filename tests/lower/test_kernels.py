"""Kernels over every U/C level combination of their operands, on both targets.

Every combination runs on llvm, except in the products of three parameters (an
operator and two formats, or three formats), whose llvm rows run a covering array of
every pair of values by default (``product_params(..., every_llvm_row=False)``); the
c target runs a covering array or a chosen subset (``c_subset``). The slow run holds
the rest (``-m slow``).

Operands are small integer-valued arrays, so every result is exact and can
be compared with ``np.array_equal``-strength assertions.  Sparse outputs are
also checked structurally: the stored coordinates must be exactly the ones
the operands' stored patterns imply (union for ``+``/``-``, intersection for
``*``, "some k contributes" for reductions).
"""

from __future__ import annotations

import shutil
import subprocess
import zlib

import numpy as np
import pytest

import ucf
from tests.helpers import (
    HAVE_CC,
    matrix_formats,
    needs_cc,
    nonzero_coords,
    product_params,
    rand_sparse,
    stored_coords,
    target_param,
    uc_combos,
)

SEED = 20240611
slow = pytest.mark.slow


def rng_for(*key) -> np.random.Generator:
    """A generator seeded by the test's parameters, so every case is reproducible."""
    return np.random.default_rng([SEED, *(zlib.crc32(str(k).encode()) for k in key)])


def pattern(arr: np.ndarray, fmt: str) -> np.ndarray:
    """0/1 indicator of the coordinates ``from_numpy(arr, fmt)`` stores."""
    ind = np.zeros(arr.shape, dtype=np.float64)
    coords, _ = ucf.from_numpy(arr, format=fmt).to_coo()
    if len(coords):
        ind[tuple(coords.T)] = 1
    return ind


def run(expr, formats, target, operands, dtype=np.float64, index_dtype=np.int32, as_tensors=True):
    """Compile ``expr`` and call it; operands are packed as ucf.Tensors in their formats."""
    k = ucf.compile(expr, formats=formats, target=target, dtype=dtype, index_dtype=index_dtype)
    ops = {}
    for n, a in operands.items():
        if as_tensors:
            ops[n] = ucf.from_numpy(a, format=formats.get(n), index_dtype=index_dtype)
        else:
            ops[n] = a
    return k(**ops)


def assert_exact(result, expected):
    got = result.toarray() if hasattr(result, "toarray") else np.asarray(result)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def check_pattern(result, expected_ind, exact=True):
    """Stored coordinates of a sparse result against the operands' structural pattern.

    ``exact``: they equal the nonzeros of ``expected_ind`` (an indicator result
    computed from the operands' stored patterns).  Otherwise (outputs with
    singleton levels are computed compressed and converted, which drops
    stored zeros; operands repacked for the loop order lose stored zeros):
    every nonzero value is stored and nothing outside the pattern is.
    """
    stored = stored_coords(result)
    structural = nonzero_coords(expected_ind)
    if exact:
        assert stored == structural
    else:
        assert nonzero_coords(result.to_numpy()) <= stored <= structural


def has_singleton(fmt: str, order: int) -> bool:
    return "S" in ucf.parse_format(fmt, order=order).letters


MAT = matrix_formats()  # 8 formats: UU/UC/CU/CC x both mode orders
MAT_SHORT = ["UU", "UC", "CU", "CC", "UC:1,0", "CC:1,0"]
T3 = uc_combos(3)  # UUU ... CCC


# --------------------------------------------------------------------- SpMV


@pytest.mark.parametrize(
    "target,fa,fx", product_params(MAT + ["coo"], ["U", "C"], c_subset=lambda c: c[1] == "C")
)
def test_spmv(target, fa, fx):
    rng = rng_for("spmv", fa, fx)
    A = rand_sparse(rng, (7, 9), 0.3, empty_rows=2)
    x = rand_sparse(rng, (9,), 0.6, empty_rows=0)
    y = run("y(i) = A(i,j) * x(j)", {"A": fa, "x": fx}, target, {"A": A, "x": x})
    assert_exact(y, A @ x)


@pytest.mark.parametrize("target", ["llvm", target_param("c")])
def test_spmv_scipy_operands(target):
    import scipy.sparse as sp

    rng = rng_for("spmv-scipy")
    A = rand_sparse(rng, (7, 9), 0.3)
    x = rand_sparse(rng, (9,), 0.5)
    for m in (sp.csr_matrix(A), sp.csc_array(A), sp.coo_matrix(A)):
        y = ucf.einsum("y(i) = A(i,j) * x(j)", target=target, A=m, x=x)
        assert_exact(y, A @ x)


# --------------------------------------------------------------------- SpMM


@pytest.mark.parametrize(
    "target,fa,fb",
    product_params(MAT, MAT, c_subset=lambda c: c[1] in ("UU:0,1", "CC:1,0") or c[0] == c[1]),
)
def test_spmm(target, fa, fb):
    rng = rng_for("spmm", fa, fb)
    A = rand_sparse(rng, (7, 9), 0.3, empty_rows=2)
    B = rand_sparse(rng, (9, 5), 0.4, empty_rows=2)
    C = run("C(i,k) = A(i,j) * B(j,k)", {"A": fa, "B": fb}, target, {"A": A, "B": B})
    assert_exact(C, A @ B)


# -------------------------------------------------------------------- SDDMM

SDDMM_CD = [("UU", "UU"), ("UC", "CU"), ("CC", "UC:1,0"), ("CU:1,0", "CC"), ("UC", "UC:1,0")]


@pytest.mark.parametrize(
    "target,fb,fcd",
    product_params(MAT, SDDMM_CD, c_subset=lambda c: c[1] == SDDMM_CD[0] or c[0] == "CC:1,0"),
)
def test_sddmm(target, fb, fcd):
    fc, fd = fcd
    rng = rng_for("sddmm", fb, fcd)
    B = rand_sparse(rng, (7, 9), 0.3, empty_rows=2)
    C = rand_sparse(rng, (7, 4), 0.6)
    D = rand_sparse(rng, (4, 9), 0.6)
    A = run(
        "A(i,j) = B(i,j) * C(i,k) * D(k,j)",
        {"B": fb, "C": fc, "D": fd},
        target,
        {"B": B, "C": C, "D": D},
    )
    assert_exact(A, B * (C @ D))


@slow
@pytest.mark.parametrize("target,fb,fc,fd", product_params(["UU", "UC", "CC"], MAT, MAT))
def test_sddmm_exhaustive(target, fb, fc, fd):
    rng = rng_for("sddmm-x", fb, fc, fd)
    B = rand_sparse(rng, (5, 6), 0.4)
    C = rand_sparse(rng, (5, 3), 0.6)
    D = rand_sparse(rng, (3, 6), 0.6)
    A = run(
        "A(i,j) = B(i,j) * C(i,k) * D(k,j)",
        {"B": fb, "C": fc, "D": fd},
        target,
        {"B": B, "C": C, "D": D},
    )
    assert_exact(A, B * (C @ D))


# ---------------------------------------------------------------------- TTV


@pytest.mark.parametrize(
    "target,fb,fc",
    product_params(T3 + ["coo", "csf", "CCC:2,0,1"], ["U", "C"], c_subset=lambda c: c[1] == "C"),
)
def test_ttv(target, fb, fc):
    rng = rng_for("ttv", fb, fc)
    B = rand_sparse(rng, (5, 6, 4), 0.25, empty_rows=1)
    c = rand_sparse(rng, (4,), 0.7)
    A = run("A(i,j) = B(i,j,k) * c(k)", {"B": fb, "c": fc}, target, {"B": B, "c": c})
    assert_exact(A, np.einsum("ijk,k->ij", B, c))


# ---------------------------------------------------------------------- TTM


@pytest.mark.parametrize(
    "target,fb,fc",
    product_params(T3 + ["coo"], ["UU", "CC", "UC:1,0"], c_subset=lambda c: c[1] == "UU"),
)
def test_ttm(target, fb, fc):
    rng = rng_for("ttm", fb, fc)
    B = rand_sparse(rng, (5, 6, 4), 0.25)
    C = rand_sparse(rng, (3, 4), 0.6)
    A = run("A(i,j,k) = B(i,j,l) * C(k,l)", {"B": fb, "C": fc}, target, {"B": B, "C": C})
    assert_exact(A, np.einsum("ijl,kl->ijk", B, C))


# ------------------------------------------------------------------- MTTKRP


@pytest.mark.parametrize(
    "target,fb,fcd",
    product_params(
        T3 + ["coo", "csf"],
        [("UU", "UU"), ("CC", "UC:1,0")],
        c_subset=lambda c: c[1] == ("UU", "UU"),
    ),
)
def test_mttkrp(target, fb, fcd):
    fc, fd = fcd
    rng = rng_for("mttkrp", fb, fcd)
    B = rand_sparse(rng, (5, 6, 4), 0.25)
    C = rand_sparse(rng, (6, 3), 0.7)
    D = rand_sparse(rng, (4, 3), 0.7)
    A = run(
        "A(i,j) = B(i,k,l) * C(k,j) * D(l,j)",
        {"B": fb, "C": fc, "D": fd},
        target,
        {"B": B, "C": C, "D": D},
    )
    assert_exact(A, np.einsum("ikl,kj,lj->ij", B, C, D))


# ------------------------------------------------------- inner/outer product


@pytest.mark.parametrize("target,fb,fc", product_params("UC", "UC"))
def test_inner_product(target, fb, fc):
    rng = rng_for("inner", fb, fc)
    b = rand_sparse(rng, (11,), 0.5)
    c = rand_sparse(rng, (11,), 0.5)
    a = run("a = b(i) * c(i)", {"b": fb, "c": fc}, target, {"b": b, "c": c})
    assert a.shape == ()
    assert a.to_numpy() == b @ c


@pytest.mark.parametrize(
    "target,fb,fc,fa",
    product_params("UC", "UC", ["UU", "UC", "CC", "CU"], every_llvm_row=False),
)
def test_outer_product(target, fb, fc, fa):
    rng = rng_for("outer", fb, fc, fa)
    b = rand_sparse(rng, (6,), 0.5)
    c = rand_sparse(rng, (7,), 0.5)
    A = run("A(i,j) = b(i) * c(j)", {"b": fb, "c": fc, "A": fa}, target, {"b": b, "c": c})
    assert_exact(A, np.outer(b, c))
    if fa != "UU":
        ind = np.outer(pattern(b, fb), pattern(c, fc))
        if fa == "CU":  # a dense inner level stores whole rows of stored i
            ind = np.repeat(ind.any(axis=1, keepdims=True), 7, axis=1)
        check_pattern(A, ind)


# -------------------------------------------------------------- elementwise

OPS = {"+": np.add, "-": np.subtract, "*": np.multiply}


def _ew_pattern(op, pb, pc):
    return pb * pc if op == "*" else pb + pc


@pytest.mark.parametrize("target,op,fb,fc", product_params("+-*", "UC", "UC", every_llvm_row=False))
def test_elementwise_vector(target, op, fb, fc):
    rng = rng_for("ewv", op, fb, fc)
    b = rand_sparse(rng, (10,), 0.4, low=1, high=10, signed=False)
    c = rand_sparse(rng, (10,), 0.4, low=10, high=20, signed=False)
    a = run(f"a(i) = b(i) {op} c(i)", {"b": fb, "c": fc}, target, {"b": b, "c": c})
    assert_exact(a, OPS[op](b, c))
    s = run(f"a(i) = b(i) {op} c(i)", {"b": fb, "c": fc, "a": "C"}, target, {"b": b, "c": c})
    assert_exact(s, OPS[op](b, c))
    check_pattern(s, _ew_pattern(op, pattern(b, fb), pattern(c, fc)))


@pytest.mark.parametrize(
    "target,op,fb,fc",
    product_params(
        "+-*", MAT, MAT_SHORT, c_subset=lambda c: c[1][:2] == c[2][:2], every_llvm_row=False
    ),
)
def test_elementwise_matrix(target, op, fb, fc):
    rng = rng_for("ewm", op, fb, fc)
    B = rand_sparse(rng, (7, 9), 0.3, empty_rows=2)
    C = rand_sparse(rng, (7, 9), 0.3, empty_rows=2)
    A = run(f"A(i,j) = B(i,j) {op} C(i,j)", {"B": fb, "C": fc}, target, {"B": B, "C": C})
    assert_exact(A, OPS[op](B, C))


@pytest.mark.parametrize(
    "target,op,fb,fc",
    product_params(
        "+-*", T3, ["UUU", "CCC", "CUC"], c_subset=lambda c: c[2] == "CCC", every_llvm_row=False
    ),
)
def test_elementwise_tensor3(target, op, fb, fc):
    rng = rng_for("ew3", op, fb, fc)
    B = rand_sparse(rng, (5, 6, 4), 0.25)
    C = rand_sparse(rng, (5, 6, 4), 0.25)
    A = run(f"A(i,j,k) = B(i,j,k) {op} C(i,j,k)", {"B": fb, "C": fc}, target, {"B": B, "C": C})
    assert_exact(A, OPS[op](B, C))


@pytest.mark.parametrize(
    "target,fa,fb,fc",
    product_params(["UC", "CC"], ["UC", "UU"], ["UC", "CC:1,0", "UU"], every_llvm_row=False),
)
def test_mul_add(target, fa, fb, fc):
    rng = rng_for("muladd", fa, fb, fc)
    A = rand_sparse(rng, (7, 9), 0.4)
    B = rand_sparse(rng, (7, 9), 0.4)
    C = rand_sparse(rng, (7, 9), 0.3)
    D = run(
        "D(i,j) = A(i,j) * B(i,j) + C(i,j)",
        {"A": fa, "B": fb, "C": fc},
        target,
        {"A": A, "B": B, "C": C},
    )
    assert_exact(D, A * B + C)


# ------------------------------------------------- transposes and reductions


@pytest.mark.parametrize("target,fa", product_params(MAT))
def test_transposed_access(target, fa):
    rng = rng_for("transpose", fa)
    A = rand_sparse(rng, (9, 7), 0.3)
    x = rand_sparse(rng, (9,), 0.6)
    B = rand_sparse(rng, (7, 9), 0.3)
    y = run("y(i) = A(j,i) * x(j)", {"A": fa}, target, {"A": A, "x": x})
    assert_exact(y, A.T @ x)
    C = run("C(i,j) = A(j,i) + B(i,j)", {"A": fa, "B": "UC"}, target, {"A": A, "B": B})
    assert_exact(C, A.T + B)
    T = run("T(i,j) = A(j,i)", {"A": fa}, target, {"A": A})
    assert_exact(T, A.T)


@pytest.mark.parametrize("target,fa", product_params(MAT + ["coo"]))
def test_full_reduction_matrix(target, fa):
    rng = rng_for("fullred", fa)
    A = rand_sparse(rng, (7, 9), 0.3)
    s = run("s = A(i,j)", {"A": fa}, target, {"A": A})
    assert s.to_numpy() == A.sum()
    s2 = run("s = A(i,j) * A2(i,j)", {"A": fa, "A2": "UC"}, target, {"A": A, "A2": A})
    assert s2.to_numpy() == (A * A).sum()


@pytest.mark.parametrize("target,fb", product_params(T3 + ["coo", "csf"]))
def test_full_reduction_tensor3(target, fb):
    rng = rng_for("fullred3", fb)
    B = rand_sparse(rng, (5, 6, 4), 0.3)
    s = run("s = B(i,j,k)", {"B": fb}, target, {"B": B})
    assert s.to_numpy() == B.sum()


def test_taco_reduction_semantics():
    """A variable only on the rhs is summed over its own term of a +, as in TACO: W is
    added once, not once per k."""
    rng = rng_for("taco")
    X = rand_sparse(rng, (3, 4, 5), 0.5)
    v = rand_sparse(rng, (5,), 0.8)
    W = rand_sparse(rng, (3, 4), 0.5)
    M = ucf.einsum("M(i,j) = X(i,j,k) * v(k) + W(i,j)", X=X, v=v, W=W)
    assert_exact(M, np.einsum("ijk,k->ij", X, v) + W)


# ------------------------------------------------------------ sparse output

SPARSE_OUT_2 = ["csr", "dcsr", "coo", "csc", "dcsc", "CU"]


@pytest.mark.parametrize(
    "target,op,fo,fbc",
    product_params(
        "+-*",
        SPARSE_OUT_2,
        [("csr", "csr"), ("dcsr", "UC:1,0"), ("UU", "csr")],
        c_subset=lambda c: c[1] in ("csr", "coo", "dcsc"),
        every_llvm_row=False,
    ),
)
def test_sparse_output_elementwise_matrix(target, op, fo, fbc):
    fb, fc = fbc
    rng = rng_for("spout", op, fo, fbc)
    B = rand_sparse(rng, (7, 9), 0.3, empty_rows=2, signed=False)
    C = rand_sparse(rng, (7, 9), 0.3, empty_rows=2, low=10, high=20, signed=False)
    A = run(f"A(i,j) = B(i,j) {op} C(i,j)", {"A": fo, "B": fb, "C": fc}, target, {"B": B, "C": C})
    assert str(A.format) == str(ucf.parse_format(fo, order=2))
    assert_exact(A, OPS[op](B, C))
    ind = _ew_pattern(op, pattern(B, fb), pattern(C, fc))
    if fo == "CU":
        # A dense inner level stores every column of each stored row; which
        # rows are stored when only dense-outer (csr) operands are iterated is
        # left open, so only require the structural pattern to be stored.
        assert nonzero_coords(ind) <= stored_coords(A)
    else:
        check_pattern(A, ind, exact=not has_singleton(fo, 2))


@pytest.mark.parametrize(
    "target,op,fo,fbc",
    product_params(
        "+*",
        ["csf", "coo", "CCC:2,0,1", "UCC"],
        [("csf", "csf"), ("coo", "UCU"), ("CCC", "UUU")],
        every_llvm_row=False,
    ),
)
def test_sparse_output_elementwise_tensor3(target, op, fo, fbc):
    fb, fc = fbc
    rng = rng_for("spout3", op, fo, fbc)
    B = rand_sparse(rng, (5, 6, 4), 0.2, signed=False)
    C = rand_sparse(rng, (5, 6, 4), 0.2, low=10, high=20, signed=False)
    A = run(
        f"A(i,j,k) = B(i,j,k) {op} C(i,j,k)", {"A": fo, "B": fb, "C": fc}, target, {"B": B, "C": C}
    )
    assert_exact(A, OPS[op](B, C))
    if "UCU" in fbc and fo not in ("csf", "coo", "UCC"):
        return  # operands repacked for the k,i,j loop order change their stored patterns
    exact = not has_singleton(fo, 3) and "UCU" not in fbc
    check_pattern(A, _ew_pattern(op, pattern(B, fb), pattern(C, fc)), exact=exact)


@pytest.mark.parametrize(
    "target,fo,fa,fb",
    product_params(["csr", "dcsr", "coo"], ["csr", "dcsr"], ["csr", "UU"], every_llvm_row=False),
)
def test_sparse_output_spmm(target, fo, fa, fb):
    rng = rng_for("spout-spmm", fo, fa, fb)
    A = rand_sparse(rng, (7, 9), 0.2, empty_rows=2, signed=False)
    B = rand_sparse(rng, (9, 6), 0.2, empty_rows=2, signed=False)
    C = run("C(i,k) = A(i,j) * B(j,k)", {"C": fo, "A": fa, "B": fb}, target, {"A": A, "B": B})
    assert_exact(C, A @ B)
    check_pattern(C, pattern(A, fa) @ pattern(B, fb), exact=not has_singleton(fo, 2))


@pytest.mark.parametrize("target", ["llvm", target_param("c")])
def test_sparse_output_spmm_exact_pattern(target):
    A = np.zeros((4, 4))
    A[0, 0] = 1
    A[1, 1] = 2
    B = np.zeros((4, 4))
    B[0, 2] = 3
    C = run(
        "C(i,k) = A(i,j) * B(j,k)", {"C": "csr", "A": "csr", "B": "csr"}, target, {"A": A, "B": B}
    )
    assert_exact(C, A @ B)
    assert stored_coords(C) == {(0, 2)}


@pytest.mark.parametrize("target,fo,fb", product_params(["csr", "dcsr", "coo"], ["csf", "coo"]))
def test_sparse_output_ttv(target, fo, fb):
    rng = rng_for("spout-ttv", fo, fb)
    B = rand_sparse(rng, (5, 6, 4), 0.2, signed=False)
    c = rand_sparse(rng, (4,), 0.6, signed=False)
    A = run("A(i,j) = B(i,j,k) * c(k)", {"A": fo, "B": fb, "c": "C"}, target, {"B": B, "c": c})
    assert_exact(A, np.einsum("ijk,k->ij", B, c))
    ind = np.einsum("ijk,k->ij", pattern(B, fb), pattern(c, "C"))
    check_pattern(A, ind, exact=not has_singleton(fo, 2))


@pytest.mark.parametrize("target", ["llvm", target_param("c")])
def test_sparse_output_ttv_exact_pattern(target):
    B = np.zeros((2, 2, 3))
    B[0, 0, 0] = 1
    B[1, 1, 2] = 2
    c = np.array([0.0, 0.0, 5.0])
    A = run(
        "A(i,j) = B(i,j,k) * c(k)", {"A": "csr", "B": "csf", "c": "C"}, target, {"B": B, "c": c}
    )
    assert_exact(A, np.einsum("ijk,k->ij", B, c))
    assert stored_coords(A) == {(1, 1)}


@pytest.mark.parametrize("target", ["llvm", target_param("c")])
def test_sparse_output_to_scipy(target):
    rng = rng_for("spout-scipy")
    B = rand_sparse(rng, (7, 9), 0.3, signed=False)
    C = rand_sparse(rng, (7, 9), 0.3, signed=False)
    A = ucf.einsum(
        "A(i,j) = B(i,j) + C(i,j)",
        formats={"A": "csr", "B": "csr", "C": "csr"},
        target=target,
        B=B,
        C=C,
    )
    import scipy.sparse as sp

    m = A  # einsum gives scipy's own array for a CSR output
    assert isinstance(m, sp.csr_array)
    np.testing.assert_array_equal(m.toarray(), B + C)
    assert m.nnz == len(nonzero_coords((B != 0) | (C != 0)))


# ------------------------------------------------------------------ dtypes

DTYPES = [np.float64, np.float32, np.int64]
IDX = [np.int32, np.int64]


@pytest.mark.parametrize("target,dtype,idt", product_params(DTYPES, IDX))
def test_dtypes_spmv_spmm(target, dtype, idt):
    rng = rng_for("dtypes", dtype, idt)
    A = rand_sparse(rng, (7, 9), 0.3, dtype=dtype)
    x = rand_sparse(rng, (9,), 0.6, dtype=dtype)
    B = rand_sparse(rng, (9, 4), 0.4, dtype=dtype)
    y = run(
        "y(i) = A(i,j) * x(j)",
        {"A": "csr", "x": "C"},
        target,
        {"A": A, "x": x},
        dtype=dtype,
        index_dtype=idt,
    )
    assert y.dtype == np.dtype(dtype)
    assert_exact(y, A @ x)
    C = run(
        "C(i,k) = A(i,j) * B(j,k)",
        {"A": "dcsr", "B": "UC"},
        target,
        {"A": A, "B": B},
        dtype=dtype,
        index_dtype=idt,
    )
    assert C.dtype == np.dtype(dtype)
    assert_exact(C, A @ B)


@pytest.mark.parametrize("target,dtype,idt", product_params(DTYPES, IDX))
def test_dtypes_sparse_output(target, dtype, idt):
    rng = rng_for("dtypes-out", dtype, idt)
    B = rand_sparse(rng, (7, 9), 0.3, dtype=dtype, signed=False)
    C = rand_sparse(rng, (7, 9), 0.3, dtype=dtype, signed=False)
    A = run(
        "A(i,j) = B(i,j) + C(i,j)",
        {"A": "csr", "B": "csr", "C": "dcsr"},
        target,
        {"B": B, "C": C},
        dtype=dtype,
        index_dtype=idt,
    )
    assert A.dtype == np.dtype(dtype)
    assert A.index_dtype == np.dtype(idt)
    assert_exact(A, B + C)
    check_pattern(A, (B != 0) | (C != 0))


@pytest.mark.parametrize("target", ["llvm", target_param("c")])
def test_einsum_infers_dtype(target):
    A = np.arange(12, dtype=np.int64).reshape(3, 4)
    x = np.arange(4, dtype=np.int64)
    y = ucf.einsum("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, target=target, A=A, x=x)
    assert y.dtype == np.int64
    assert_exact(y, A @ x)
    y32 = ucf.einsum(
        "y(i) = A(i,j) * x(j)", target=target, A=A.astype(np.float32), x=x.astype(np.float32)
    )
    assert y32.dtype == np.float32


# -------------------------------------------------------------- edge cases


@pytest.mark.parametrize("target,fa", product_params(["csr", "dcsr", "csc", "coo", "CU"]))
def test_empty_operands(target, fa):
    A = np.zeros((7, 9))
    x = np.arange(9, dtype=np.float64)
    y = run("y(i) = A(i,j) * x(j)", {"A": fa}, target, {"A": A, "x": x})
    assert_exact(y, np.zeros(7))
    S = run("S(i,j) = A(i,j) * B(i,j)", {"S": "csr", "A": fa, "B": "csr"}, target, {"A": A, "B": A})
    assert S.nnz == 0
    assert_exact(S, np.zeros((7, 9)))
    S2 = run(
        "S(i,j) = A(i,j) + B(i,j)", {"S": "dcsr", "A": fa, "B": "csr"}, target, {"A": A, "B": A}
    )
    assert S2.nnz == 0
    s = run("s = A(i,j)", {"A": fa}, target, {"A": A})
    assert s.to_numpy() == 0


@pytest.mark.parametrize("target,fa", product_params(["csr", "dcsr", "coo", "UU"]))
def test_empty_rows_and_columns(target, fa):
    A = np.zeros((6, 5))
    A[2, 1] = 3
    A[2, 4] = -1
    A[5, 0] = 2
    x = np.array([1.0, 2, 3, 4, 5])
    y = run("y(i) = A(i,j) * x(j)", {"A": fa}, target, {"A": A, "x": x})
    assert_exact(y, A @ x)
    B = np.zeros((6, 5))
    B[0, 0] = 1
    B[2, 4] = 1
    S = run("S(i,j) = A(i,j) + B(i,j)", {"S": "csr", "A": fa, "B": "csr"}, target, {"A": A, "B": B})
    assert_exact(S, A + B)
    if fa != "UU":
        check_pattern(S, (A != 0) | (B != 0))


@pytest.mark.parametrize("target,fa", product_params(["UU", "UC", "CC", "coo"]))
def test_one_by_one(target, fa):
    A = np.array([[3.0]])
    x = np.array([2.0])
    y = run("y(i) = A(i,j) * x(j)", {"A": fa}, target, {"A": A, "x": x})
    assert_exact(y, A @ x)
    S = run("S(i,j) = A(i,j) * B(i,j)", {"S": "csr", "A": fa, "B": "UC"}, target, {"A": A, "B": A})
    assert_exact(S, A * A)
    Z = run(
        "S(i,j) = A(i,j) * B(i,j)",
        {"S": "csr", "A": fa, "B": "UC"},
        target,
        {"A": np.zeros((1, 1)), "B": A},
    )
    assert_exact(Z, np.zeros((1, 1)))
    assert Z.nnz == (1 if fa == "UU" else 0)  # a dense operand stores its zero


@pytest.mark.parametrize("target,shape", product_params([(1, 9), (7, 1)]))
@pytest.mark.parametrize("fa", ["csr", "dcsc", "coo"])
def test_dimension_of_size_one(target, shape, fa):
    rng = rng_for("dim1", shape, fa)
    A = rand_sparse(rng, shape, 0.5, empty_rows=0)
    B = rand_sparse(rng, (shape[1], 3), 0.5)
    C = run("C(i,k) = A(i,j) * B(j,k)", {"A": fa, "B": "csr"}, target, {"A": A, "B": B})
    assert_exact(C, A @ B)
    S = run(
        "S(i,j) = A(i,j) + A2(i,j)", {"S": "dcsr", "A": fa, "A2": "csr"}, target, {"A": A, "A2": A}
    )
    assert_exact(S, 2 * A)
    T = rand_sparse(rng, (1, shape[1], 1), 0.5, empty_rows=0)
    t = run("t(j) = T(i,j,k)", {"T": "csf"}, target, {"T": T})
    assert_exact(t, T.sum(axis=(0, 2)))


@pytest.mark.parametrize("target,fmt", product_params(["csr", "dcsr", "coo", "csc"]))
def test_from_coo_duplicates_summed(target, fmt):
    coords = np.array([[0, 1], [2, 3], [0, 1], [2, 3], [2, 3], [1, 0]])
    vals = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    A = ucf.from_coo(coords, vals, shape=(3, 4), format=fmt)
    dense = np.zeros((3, 4))
    np.add.at(dense, tuple(coords.T), vals)
    assert A.nnz == 3
    x = np.array([1.0, -2.0, 3.0, 0.5])
    y = ucf.einsum("y(i) = A(i,j) * x(j)", target=target, A=A, x=x)
    assert_exact(y, dense @ x)
    S = ucf.einsum(
        "S(i,j) = A(i,j) + B(i,j)",
        formats={"S": "csr"},
        target=target,
        A=A,
        B=ucf.from_numpy(dense, format="csr"),
        as_tensor=True,
    )
    assert_exact(S, 2 * dense)
    assert stored_coords(S) == nonzero_coords(dense)


# ------------------------------------------------------------ differential

DIFF_KERNELS = [
    ("y(i) = A(i,j) * x(j)", {"A": "csr"}, {"A": (7, 9), "x": (9,)}),
    ("C(i,k) = A(i,j) * B(j,k)", {"A": "dcsr", "B": "csc"}, {"A": (7, 9), "B": (9, 5)}),
    ("A(i,j) = B(i,j,k) * c(k)", {"B": "csf", "c": "C"}, {"B": (5, 6, 4), "c": (4,)}),
    ("S(i,j) = A(i,j) + B(i,j)", {"S": "csr", "A": "csr", "B": "dcsr"}, {"A": (7, 9), "B": (7, 9)}),
    (
        "A(i,j) = B(i,k,l) * C(k,j) * D(l,j)",
        {"B": "coo"},
        {"B": (5, 6, 4), "C": (6, 3), "D": (4, 3)},
    ),
]


@needs_cc
@pytest.mark.parametrize("expr,formats,shapes", DIFF_KERNELS)
def test_llvm_and_c_identical(expr, formats, shapes):
    rng = rng_for("diff", expr)
    ops = {}
    for n, s in shapes.items():
        a = rand_sparse(rng, s, 0.4)
        ops[n] = a + rng.random(s) * (a != 0)  # non-integer values: same rounding expected
    r_llvm = run(expr, formats, "llvm", ops)
    r_c = run(expr, formats, "c", ops)
    assert np.array_equal(r_llvm.to_numpy(), r_c.to_numpy())
    if not ucf.parse_format(formats.get(expr.split("(")[0], "dense"), order=2).is_dense:
        assert stored_coords(r_llvm) == stored_coords(r_c)


# ------------------------------------------------------------ saved source

SAVE_KERNELS = [
    ("spmv", "y(i) = A(i,j) * x(j)", {"A": "csr"}, "float64", "int32"),
    ("spmm", "C(i,k) = A(i,j) * B(j,k)", {"A": "dcsr", "B": "csc"}, "float32", "int64"),
    ("ttv", "A(i,j) = B(i,j,k) * c(k)", {"B": "csf", "c": "C"}, "int64", "int32"),
    ("add", "S(i,j) = A(i,j) + B(i,j)", {"S": "csr", "A": "csr", "B": "csr"}, "float64", "int32"),
    (
        "mulcoo",
        "S(i,j,k) = A(i,j,k) * B(i,j,k)",
        {"S": "coo", "A": "coo", "B": "csf"},
        "float64",
        "int64",
    ),
    ("dot", "a = b(i) * c(i)", {"b": "C"}, "float64", "int32"),
]


@pytest.mark.skipif(not HAVE_CC, reason="needs a C compiler")
@pytest.mark.parametrize("name,expr,formats,dtype,idt", SAVE_KERNELS)
def test_saved_source_compiles_cleanly(tmp_path, name, expr, formats, dtype, idt):
    k = ucf.compile(expr, formats=formats, dtype=dtype, index_dtype=idt)
    csrc, h = k.save(tmp_path / name)
    assert csrc.exists() and h.exists()
    assert csrc.suffix == ".c" and h.suffix == ".h"
    header = h.read_text()
    assert f"void {name}(" in header  # exported functions are named after the file
    if "S" in formats:
        assert f"{name}_assemble" in header
    proc = subprocess.run(
        [
            shutil.which("cc"),
            "-std=c99",
            "-c",
            "-Wall",
            "-Werror",
            str(csrc),
            "-o",
            str(tmp_path / f"{name}.o"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
