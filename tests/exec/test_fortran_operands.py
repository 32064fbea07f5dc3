"""A Fortran-ordered numpy operand is dense storage with its modes reversed.

A kernel that reads it column-major (SDDMM's ``convert(D)``) reads it in place, with
no copy and no warning; one that reads it row-major copies it once, silently, as it
copies any other array it cannot read as stored. Results against numpy and scipy.
"""

from __future__ import annotations

import threading
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


def test_two_threads_at_once_one_fortran_array_one_relaid_tensor():
    """Whether a relayout is said rides on the operand itself: a thread passing a
    Fortran-ordered array (silent) beside one passing a Tensor stored in another mode
    order (said, once) on one kernel at the same time; each result against numpy."""
    rng = np.random.default_rng(2)
    A = np.asfortranarray(rng.standard_normal((6, 5, 4)))
    x = rng.standard_normal(4)
    want = np.einsum("ijk,k->ij", A, x)
    stored = ucf.from_numpy(np.ascontiguousarray(A), format="UUU:0,2,1")
    k = ucf.compile("y(i,j) = A(i,j,k) * x(k)")
    start = threading.Barrier(2)
    results: dict[str, list] = {"array": [], "tensor": []}

    def calls(kind, a):
        start.wait()
        for _ in range(200):
            results[kind].append(np.asarray(k(A=a, x=x)))

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        threads = [
            threading.Thread(target=calls, args=("array", A)),
            threading.Thread(target=calls, args=("tensor", stored)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    conversions = [str(w.message) for w in said if issubclass(w.category, ucf.ConversionWarning)]
    assert len(conversions) == 1 and "stored as 'UUU:0,2,1'" in conversions[0], conversions
    for kind in results:
        assert len(results[kind]) == 200
        for got in results[kind]:
            np.testing.assert_allclose(got, want, rtol=1e-12)
