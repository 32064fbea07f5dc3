"""The prefetch of rows an indirect loop walks (``ucf.passes.prefetch``): Gustavson
SpGEMM's rows of B, against scipy on both targets, bit for bit between them, and in
bounds under ASan where A's rows are shorter than the distance."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.asan import run_under_asan
from tests.helpers import TARGETS, needs_cc
from ucf.ir import nodes as ir
from ucf.ir.walk import nodes

SPGEMM = "C(i,k) = A(i,j) * B(j,k)"
CSR = {"A": "csr", "B": "csr", "C": "csr"}


def fetched(fn: ir.Function) -> set[str]:
    return {n.array.name for n in nodes(fn.body) if isinstance(n, ir.Prefetch)}


def short_rows(rng) -> sp.csr_matrix:
    """Rows of 0 to 4 entries (shorter than the distance, and longer), the last row
    ending at A's last entry, and a row of every column."""
    n = 40
    rows = [rng.choice(n, size=rng.integers(0, 5), replace=False) for _ in range(n - 1)]
    rows.append(np.arange(n))
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    indices = np.concatenate(rows).astype(np.int32)
    vals = rng.standard_normal(indices.size)
    return sp.csr_matrix((vals, indices, indptr), shape=(n, n))


@pytest.mark.parametrize("target", TARGETS)
def test_spgemm_prefetches_rows_of_b_and_matches_scipy(target, monkeypatch):
    # The stream pass also fetches A's coordinates where the parallel plan counts each
    # row's products (ucf.passes.streams, tests/passes/test_streams.py): off here.
    monkeypatch.setenv("UCF_STREAM_PREFETCH", "0")
    rng = np.random.default_rng(38)
    a, b = short_rows(rng), sp.random(40, 60, density=0.1, format="csr", random_state=3)
    k = ucf.compile(SPGEMM, formats=CSR, target=target)
    compute, assemble = k.llir[-1], next(f for f in k.llir if f.name == "kernel_assemble")
    assert fetched(compute) == {"B1_crd", "B_vals"}
    assert fetched(assemble) == {"B1_crd"}
    got = k(A=a, B=b).to_scipy()
    np.testing.assert_allclose(got.toarray(), (a @ b).toarray(), rtol=1e-12, atol=1e-12)


@needs_cc
def test_prefetch_changes_no_bit_and_llvm_equals_c(monkeypatch, tmp_path):
    monkeypatch.setenv("UCF_STREAM_PREFETCH", "0")  # this pass's prefetches alone
    rng = np.random.default_rng(5)
    a = sp.random(300, 200, density=0.03, format="csr", random_state=rng)
    b = sp.random(200, 250, density=0.03, format="csr", random_state=rng)
    targets = ("llvm", "c")
    got = {t: ucf.compile(SPGEMM, formats=CSR, target=t)(A=a, B=b).to_scipy() for t in targets}
    monkeypatch.setattr("ucf.pipeline.prefetch_rows", lambda fn: fn)
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))  # a plan without the pass
    plain = ucf.compile(SPGEMM, formats=CSR, target="c")
    assert not fetched(plain.llir[-1])
    want = plain(A=a, B=b).to_scipy()
    for t in targets:
        assert np.array_equal(got[t].indptr, want.indptr)
        assert np.array_equal(got[t].indices, want.indices)
        assert np.array_equal(got[t].data, want.data)  # bit for bit


def test_direct_inner_loops_get_no_prefetch(monkeypatch):
    """CSR times dense, and a CSF walk (the inner start is the outer position, not a
    coordinate loaded there): no row to prefetch (the stream prefetches of
    ``ucf.passes.streams``, off here, fetch the CSF walk's streams)."""
    monkeypatch.setenv("UCF_STREAM_PREFETCH", "0")
    spmm = ucf.compile("C(i,j) = A(i,k) * B(k,j)", formats={"A": "csr"})
    ttv = ucf.compile("A(i,j) = B(i,j,k) * c(k)", formats={"B": "csf"})
    assert not any(fetched(f) for f in [*spmm.llir, *ttv.llir])


def test_prefetch_stays_in_bounds_under_asan(asan_cc, tmp_path):
    rng = np.random.default_rng(9)
    a, b = short_rows(rng), short_rows(rng)
    k = ucf.compile(SPGEMM, formats=CSR, target="c")
    assert fetched(k.llir[-1])
    ops = {
        n: ucf.from_scipy(m, format="csr", index_dtype=np.int32) for n, m in (("A", a), ("B", b))
    }
    out = run_under_asan(asan_cc, tmp_path, k, "csr", (40, 40), {"i": 40, "j": 40, "k": 40}, ops)
    out.validate()
    np.testing.assert_allclose(out.to_numpy(), (a @ b).toarray(), rtol=1e-12, atol=1e-12)


SDDMM = "A(i,j) = B(i,j) * C(i,k) * D(k,j)"
SDDMM_FORMATS = {"A": "csr", "B": "csr", "D": "UU:1,0"}


def sddmm_operands(rng, kdim: int = 13):
    b = short_rows(rng)
    c, d = rng.standard_normal((40, kdim)), rng.standard_normal((kdim, 40))
    return b, c, d, b.multiply(c @ d).toarray()


@pytest.mark.parametrize("target", TARGETS)
def test_sddmm_prefetches_the_columns_of_d_ahead(target):
    """A dot product per stored entry of B: D's column at the coordinate 6 entries on,
    into the next rows; the SpMM beside it (independent steps) gets none."""
    rng = np.random.default_rng(11)
    b, c, d, want = sddmm_operands(rng)
    k = ucf.compile(SDDMM, formats=SDDMM_FORMATS, target=target)
    assert fetched(k.llir[-1]) == {"D_vals"}
    got = k(B=b, C=c, D=ucf.from_numpy(d, format="UU:1,0"))
    np.testing.assert_allclose(got.to_scipy().toarray(), want, rtol=1e-12, atol=1e-12)


@needs_cc
def test_the_slab_prefetch_changes_no_bit(monkeypatch, tmp_path):
    rng = np.random.default_rng(12)
    b, c, d, _ = sddmm_operands(rng, 64)
    dd = ucf.from_numpy(d, format="UU:1,0")
    got = {
        t: ucf.compile(SDDMM, formats=SDDMM_FORMATS, target=t)(B=b, C=c, D=dd).to_scipy().data
        for t in ("llvm", "c")
    }
    monkeypatch.setattr("ucf.pipeline.prefetch_rows", lambda fn: fn)
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    plain = ucf.compile(SDDMM, formats=SDDMM_FORMATS, target="c")
    assert not fetched(plain.llir[-1])
    want = plain(B=b, C=c, D=dd).to_scipy().data
    for v in got.values():
        assert np.array_equal(v, want)


def test_the_slab_prefetch_stays_in_bounds_under_asan(asan_cc, tmp_path):
    """Rows shorter than the distance and the last entries of B: the coordinate ahead is
    read only below the end of B's last row."""
    rng = np.random.default_rng(13)
    b, c, d, want = sddmm_operands(rng, 9)
    k = ucf.compile(SDDMM, formats=SDDMM_FORMATS, target="c")
    assert fetched(k.llir[-1])
    ops = {
        "B": ucf.from_scipy(b, format="csr", index_dtype=np.int32),
        "C": ucf.from_numpy(c),
        "D": ucf.from_numpy(d, format="UU:1,0"),
    }
    out = run_under_asan(asan_cc, tmp_path, k, "csr", (40, 40), {"i": 40, "j": 40, "k": 9}, ops)
    np.testing.assert_allclose(out.to_scipy().toarray(), want, rtol=1e-12, atol=1e-12)
