"""Partial sums (ucf.passes.partial_sums): SpMV's rows and SDDMM's dot products over
``k`` summed in one vector's worth of chains. Against scipy and numpy on both CPU
targets, over empty rows, rows of length 1 to 7 (the remainders), a single long row,
and both layouts of SDDMM's D, and a scalar summed over every row (a chain per short
row); bit for bit between the targets; and, in float64, bit
for bit against the documented order replayed in exact rational arithmetic (each fused
multiply-add rounded once from the exact value)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.asan import run_under_asan
from tests.helpers import TARGETS, documented_sum, exact_fma
from ucf.ir.printer import format_functions
from ucf.ir.walk import loops

SPMV = "y(i) = A(i,j) * x(j)"
SDDMM = "A(i,j) = B(i,j) * C(i,k) * D(k,j)"
PARTS = {"float32": 8, "float64": 4}


def _rows_matrix(rng, lengths: list[int], cols: int, dtype) -> sp.csr_matrix:
    """A CSR matrix whose rows hold exactly ``lengths`` entries (0 for an empty row)."""
    indptr = np.concatenate(([0], np.cumsum(lengths)))
    indices = np.concatenate(
        [np.sort(rng.choice(cols, size=n, replace=False)) for n in lengths] or [[]]
    ).astype(np.int32)
    data = rng.standard_normal(int(indptr[-1])).astype(dtype)
    return sp.csr_matrix((data, indices, indptr), shape=(len(lengths), cols))


LENGTHS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 0, 31, 32, 33, 34, 35, 63, 64, 70]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_spmv_rows_of_every_remainder(dtype):
    rng = np.random.default_rng(3)
    m = _rows_matrix(rng, LENGTHS, 80, dtype)
    x = rng.standard_normal(80).astype(dtype)
    got = {}
    for target in [t if isinstance(t, str) else t.values[0] for t in TARGETS]:
        k = ucf.compile(SPMV, formats={"A": "csr"}, dtype=dtype, target=target)
        assert "partial sums: the sum over j" in k.cin
        got[target] = np.asarray(k(A=ucf.from_scipy(m, format="csr"), x=x))
        tol = 1e-5 if dtype == "float32" else 1e-12
        np.testing.assert_allclose(got[target], m @ x, rtol=tol, atol=tol)
    if "c" in got:
        assert np.array_equal(got["llvm"], got["c"])
    if dtype == "float64":
        want = [
            documented_sum(list(zip(m.data[a:b], x[m.indices[a:b]], strict=True)), PARTS[dtype])
            for a, b in zip(m.indptr[:-1], m.indptr[1:], strict=True)
        ]
        assert np.array_equal(got["llvm"], np.array(want))


def _carried(rows: list[list[tuple[float, float]]], parts: int) -> float:
    """A scalar summed over every row (``s = A(i,j)*x(j)``) in the documented order: a
    short row's terms in a chain of their own from 0, added to the sum after it; a long
    row's partial sums folded and added to the sum, then its last terms in order."""
    total = 0.0
    for terms in rows:
        if len(terms) < 4 * parts:
            total += documented_sum(terms, parts)
            continue
        whole = len(terms) // parts * parts
        total += documented_sum(terms[:whole], parts)
        for a, b in terms[whole:]:
            total = exact_fma(a, b, total)
    return total


def test_a_sum_carried_across_rows_keeps_a_chain_per_row():
    """A sum over every row into one scalar: each short row's chain starts from 0, so the
    rows overlap; bit for bit the documented order on both targets, and near scipy's."""
    rng = np.random.default_rng(11)
    m = _rows_matrix(rng, LENGTHS * 2, 80, np.float64)
    x = rng.standard_normal(80)
    rows = [
        list(zip(m.data[a:b], x[m.indices[a:b]], strict=True))
        for a, b in zip(m.indptr[:-1], m.indptr[1:], strict=True)
    ]
    want = _carried(rows, 4)
    for target in [t if isinstance(t, str) else t.values[0] for t in TARGETS]:
        k = ucf.compile("s = A(i,j) * x(j)", formats={"A": "csr"}, target=target)
        assert "t0_r0 = fma(" in format_functions(k.llir), target
        got = float(np.asarray(k(A=ucf.from_scipy(m, format="csr"), x=x)))
        assert got == want, target
        np.testing.assert_allclose(got, (m @ x).sum(), rtol=1e-12)


@pytest.mark.parametrize("target", TARGETS)
def test_spmv_single_long_row(target):
    rng = np.random.default_rng(4)
    m = _rows_matrix(rng, [4099], 5000, np.float64)
    x = rng.standard_normal(5000)
    k = ucf.compile(SPMV, formats={"A": "csr"}, target=target)
    got = np.asarray(k(A=ucf.from_scipy(m, format="csr"), x=x))
    terms = list(zip(m.data, x[m.indices], strict=True))
    assert got[0] == documented_sum(terms, 4)
    np.testing.assert_allclose(got, m @ x, rtol=1e-10)


def test_spmv_on_threads_sums_alike():
    """The order depends only on a row's length: rows split over two threads give the
    serial kernel's bits, on both targets."""
    rng = np.random.default_rng(10)
    m = _rows_matrix(rng, LENGTHS * 3, 80, np.float64)
    a, x = ucf.from_scipy(m, format="csr"), rng.standard_normal(80)
    serial = np.asarray(ucf.compile(SPMV, formats={"A": "csr"})(A=a, x=x))
    np.testing.assert_allclose(serial, m @ x, rtol=1e-12, atol=1e-12)
    schedule = "split(i, i0, i1, 8); parallelize(i0, CPUThread, NoRaces)"
    ucf.set_num_threads(2)
    for target in [t if isinstance(t, str) else t.values[0] for t in TARGETS]:
        k = ucf.compile(SPMV, formats={"A": "csr"}, schedule=schedule, target=target)
        assert "partial sums: the sum over j" in k.cin
        assert np.array_equal(np.asarray(k(A=a, x=x)), serial), target


def test_switched_off_is_one_chain(monkeypatch):
    """UCF_PARTIAL_SUMS=0 keeps the single chain of fused multiply-adds."""
    monkeypatch.setenv("UCF_PARTIAL_SUMS", "0")
    rng = np.random.default_rng(5)
    m = _rows_matrix(rng, [37], 50, np.float64)
    x = rng.standard_normal(50)
    k = ucf.compile(SPMV, formats={"A": "csr"})
    assert "partial sums" not in k.cin
    total = 0.0
    for a, b in zip(m.data, x[m.indices], strict=True):
        total = exact_fma(a, b, total)
    assert np.asarray(k(A=ucf.from_scipy(m, format="csr"), x=x))[0] == total
    monkeypatch.setenv("UCF_PARTIAL_SUMS", "2")
    with pytest.raises(ucf.UcfError, match="UCF_PARTIAL_SUMS"):
        ucf.compile("z(i) = A(i,j) * x(j)", formats={"A": "csr"})


def _sddmm_reference(b: sp.csr_matrix, c: np.ndarray, d: np.ndarray) -> np.ndarray:
    rows = np.repeat(np.arange(b.shape[0]), np.diff(b.indptr))
    dots = np.einsum("pk,pk->p", c[rows].astype(np.float64), d[:, b.indices].T.astype(np.float64))
    return b.data * dots


#: Dot products over k: one chain (below 4P), each remainder 0 to 7 of the blocks of P
#: (P = 4 float64, 8 float32), and a long one.
KDIMS = [1, 5, 13, 16, 17, 18, 19, 31, 32, 33, 34, 35, 36, 37, 38, 39, 64, 515]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", ["UU", "UU:1,0"])
def test_sddmm_against_numpy(dtype, layout):
    """B has empty rows, rows of 1 to 7 nonzeros and one long row; K runs over every
    remainder of the split dot product. The kernel takes K at the call, so each target
    compiles once."""
    rng = np.random.default_rng(8)
    b = _rows_matrix(rng, [0, 1, 2, 3, 4, 5, 6, 7, 0, 10, 240], 256, dtype)
    kernels = {
        target: ucf.compile(SDDMM, formats={"A": "csr", "B": "csr", "D": layout}, target=target)
        for target in [t if isinstance(t, str) else t.values[0] for t in TARGETS]
    }
    for k in kernels.values():
        assert "partial sums: the sum over k" in k.cin
        assert "bound(k" not in k.cin
    tol = 1e-4 if dtype == "float32" else 1e-12
    for kdim in KDIMS:
        c = rng.standard_normal((b.shape[0], kdim)).astype(dtype)
        d = rng.standard_normal((kdim, b.shape[1])).astype(dtype)
        dd = ucf.from_numpy(np.asfortranarray(d) if layout != "UU" else d, format=layout)
        got = {}
        for target, k in kernels.items():
            out = k(B=ucf.from_scipy(b, format="csr"), C=c, D=dd).to_scipy()
            got[target] = out.data
            assert np.array_equal(out.indices, b.indices) and np.array_equal(out.indptr, b.indptr)
            np.testing.assert_allclose(
                out.data, _sddmm_reference(b, c, d), rtol=tol, atol=tol * np.sqrt(kdim)
            )
        if "c" in got:
            assert np.array_equal(got["llvm"], got["c"]), kdim


def test_sddmm_documented_order():
    """Each term is (B * C) rounded, then fused with D, in the documented order."""
    rng = np.random.default_rng(9)
    kdim = 23
    b = _rows_matrix(rng, [3, 0, 5], 8, np.float64)
    c = rng.standard_normal((3, kdim))
    d = rng.standard_normal((kdim, 8))
    k = ucf.compile(SDDMM, formats={"A": "csr", "B": "csr", "D": "UU:1,0"})
    got = k(
        B=ucf.from_scipy(b, format="csr"),
        C=c,
        D=ucf.from_numpy(np.asfortranarray(d), format="UU:1,0"),
    )
    rows = np.repeat(np.arange(3), np.diff(b.indptr))
    want = [
        documented_sum([(v * c[i, q], d[q, j]) for q in range(kdim)], 4)
        for v, i, j in zip(b.data, rows, b.indices, strict=True)
    ]
    assert np.array_equal(got.to_scipy().data, np.array(want))


@pytest.mark.parametrize("layout", ["UU", "UU:1,0"])
def test_sddmm_under_asan(asan_cc, tmp_path, layout):
    """The vector loads of a dot product stay inside C's and D's rows: K = 13 leaves 3
    whole blocks of 4 and a remainder of 1."""
    rng = np.random.default_rng(2)
    b = _rows_matrix(rng, [2, 0, 9, 1], 10, np.float64)
    c = rng.standard_normal((4, 13))
    d = rng.standard_normal((13, 10))
    dd = ucf.from_numpy(np.asfortranarray(d) if layout != "UU" else d, format=layout)
    k = ucf.compile(SDDMM, formats={"A": "csr", "B": "csr", "D": layout}, target="c")
    ops = {"B": ucf.from_scipy(b, format="csr"), "C": ucf.from_numpy(c), "D": dd}
    out = run_under_asan(asan_cc, tmp_path, k, "csr", (4, 10), {"i": 4, "j": 10, "k": 13}, ops)
    np.testing.assert_allclose(out.to_scipy().data, _sddmm_reference(b, c, d), rtol=1e-12)


def test_spmv_under_asan(asan_cc, tmp_path):
    rng = np.random.default_rng(6)
    m = _rows_matrix(rng, [0, 7, 1, 9, 4, 0], 12, np.float64)
    x = rng.standard_normal(12)
    k = ucf.compile(SPMV, formats={"A": "csr"}, target="c")
    ops = {"A": ucf.from_scipy(m, format="csr"), "x": ucf.from_numpy(x)}
    out = run_under_asan(asan_cc, tmp_path, k, "U", (6,), {"i": 6, "j": 12}, ops)
    np.testing.assert_allclose(out.to_numpy(), m @ x, rtol=1e-12)


def test_sddmm_assemble_has_no_loop_over_k():
    """The assemble pass of a sparse output only needs to know that k's loop runs: its
    hit flag is set at most once (``ucf.ir.simplify``), not once per k; an empty k
    drops every entry, as before."""
    k = ucf.compile(SDDMM, formats={"A": "csr", "B": "csr"})
    assemble = next(f for f in k.llir if f.name == "kernel_assemble")
    assert "k" not in {s.var.name for _, s in loops(assemble.body)}
    b = _rows_matrix(np.random.default_rng(1), [2, 0, 3], 5, np.float64)
    empty = k(B=ucf.from_scipy(b, format="csr"), C=np.zeros((3, 0)), D=np.zeros((0, 5)))
    assert empty.to_scipy().nnz == 0
