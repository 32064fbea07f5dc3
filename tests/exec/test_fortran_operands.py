"""A Fortran-ordered numpy operand is dense storage with its modes reversed.

A kernel that reads it column-major (SDDMM's ``convert(D)``) reads it in place, with
no copy and no warning; one that reads it row-major copies it once, silently, as it
copies any other array it cannot read as stored. Results against numpy and scipy.
"""

from __future__ import annotations

import tracemalloc
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import ucf

SDDMM = "A(i,j) = B(i,j) * C(i,k) * D(k,j)"


def sddmm_operands(n=300, m=280, K=16, seed=0):
    rng = np.random.default_rng(seed)
    B = sp.random(n, m, density=0.05, format="csr", random_state=seed)
    return B, rng.standard_normal((n, K)), np.asfortranarray(rng.standard_normal((K, m)))


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("schedule", [None, "convert(D)"])
def test_sddmm_with_a_fortran_ordered_factor(schedule, target):
    B, C, D = sddmm_operands()
    k = ucf.compile(SDDMM, {"A": "csr", "B": "csr"}, schedule=schedule, target=target)
    with warnings.catch_warnings():
        if schedule is not None:  # D is column-major already: read in place
            warnings.simplefilter("error", ucf.ConversionWarning)
        got = k(B=B, C=C, D=D).to_scipy()
    want = B.multiply(C @ D).tocsr()
    np.testing.assert_allclose(got.toarray(), want.toarray(), rtol=1e-12, atol=1e-12)


def test_a_column_major_read_makes_no_copy():
    B, C, D = sddmm_operands(n=400, m=4000, K=256)
    k = ucf.compile(SDDMM, {"A": "csr", "B": "csr"}, schedule="convert(D)")
    k(B=B, C=C, D=D)  # first call: plan and buffers
    tracemalloc.start()
    k(B=B, C=C, D=D)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < D.nbytes / 2, f"a call allocated {peak} bytes; D has {D.nbytes}"


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_fortran_operands_read_row_major_are_copied_silently(target):
    rng = np.random.default_rng(1)
    A = np.asfortranarray(rng.standard_normal((6, 5, 4)))
    x = rng.standard_normal(4)
    k = ucf.compile("y(i,j) = A(i,j,k) * x(k)", target=target)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ucf.ConversionWarning)
        got = np.asarray(k(A=A, x=x))
    np.testing.assert_allclose(got, np.einsum("ijk,k->ij", A, x), rtol=1e-12)
    sliced = np.asfortranarray(rng.standard_normal((8, 5, 4)))[::2]  # neither C nor F
    np.testing.assert_allclose(np.asarray(k(A=sliced, x=x)), np.einsum("ijk,k->ij", sliced, x))


@pytest.mark.parametrize(
    ("out", "said"),
    [
        (np.zeros((3, 3), order="F"), r"got an array not C-contiguous \(Fortran-ordered\)"),
        (np.zeros((3, 6))[:, ::2], r"got an array not C-contiguous \(strided\)"),
        (np.zeros((3, 3), dtype=np.float32), "got float32"),
    ],
)
def test_an_out_array_it_cannot_write_is_refused_with_why(out, said):
    """An ``out=`` the kernel cannot write in place names what is wrong with it (a
    Fortran-ordered float64 array was refused as 'got float64')."""
    k = ucf.compile("C(i,j) = A(i,k)*B(k,j)", {"A": "csr"})
    with pytest.raises(ucf.OperandError, match=said):
        k(A=np.eye(3), B=np.ones((3, 3)), out=out)
