"""Stream prefetches (ucf.passes.streams): SpMV's rows ask for their position streams'
lines ahead. Against scipy on both CPU targets at 1 and 2 threads, over empty rows, rows
of 1 to 7 (the remainders of a split chain), a single long row and power-law rows;
bit for bit between the targets and against the kernel without the pass (a prefetch
moves a line, never a value); where the prefetches go (a row's own streams, not the
rows SpGEMM walks at A's coordinates); and under AddressSanitizer, where every
prefetch of these small matrices points past the arrays' ends."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.asan import run_under_asan
from tests.passes.test_partial_sums import LENGTHS, _rows_matrix
from ucf.errors import UcfError
from ucf.ir import nodes as ir
from ucf.ir.walk import nodes
from ucf.passes.streams import DISTANCE

SPMV = "y(i) = A(i,j) * x(j)"


def _power_law(rng, rows: int, cols: int) -> sp.csr_matrix:
    """Rows of Zipf-distributed lengths (most short, a few hundreds long), columns at
    random."""
    lengths = np.minimum(rng.zipf(1.6, size=rows), cols)
    return _rows_matrix(rng, [int(n) for n in lengths], cols, np.float64)


def _matrices(rng) -> dict[str, sp.csr_matrix]:
    long_row = [0] * 5 + [3000] + [0] * 4
    return {
        "remainders": _rows_matrix(rng, LENGTHS, 80, np.float64),
        "one long row": _rows_matrix(rng, long_row, 4000, np.float64),
        "power law": _power_law(rng, 3000, 2000),
        "empty": sp.csr_matrix((7, 9)),
    }


def _prefetches(k) -> list[ir.Prefetch]:
    return [n for f in k.llir for n in nodes(f.body) if isinstance(n, ir.Prefetch)]


def test_spmv_with_streams_matches_scipy_and_itself_without(threads, monkeypatch):
    rng = np.random.default_rng(38)
    operands = [(name, m, rng.standard_normal(m.shape[1])) for name, m in _matrices(rng).items()]
    got: dict[str, dict[str, np.ndarray]] = {}
    for target in ("llvm", "c"):
        k = ucf.compile(SPMV, formats={"A": "csr"}, target=target)
        monkeypatch.setenv("UCF_STREAM_PREFETCH", "0")
        plain = ucf.compile(SPMV, formats={"A": "csr"}, target=target)
        monkeypatch.delenv("UCF_STREAM_PREFETCH")
        for name, m, x in operands:
            a = ucf.from_scipy(m, format="csr")
            y = np.asarray(k(A=a, x=x))
            np.testing.assert_allclose(y, m @ x, rtol=1e-12, atol=1e-12, err_msg=name)
            assert np.array_equal(y, np.asarray(plain(A=a, x=x))), name
            got.setdefault(name, {})[target] = y
        assert "prefetch: A1_crd, A_vals of loop j" in k.cin
        assert "prefetch:" not in plain.cin
    for name, y in got.items():
        assert np.array_equal(y["llvm"], y["c"]), name


def test_a_rows_streams_are_fetched_and_no_others():
    """SpMV: each short row's walk fetches crd and vals ``DISTANCE`` bytes past its start,
    and each block of a long row's partial sums past the block. SpGEMM and SpMM walk A's
    rows with a loop in each step (B's row, the columns): no stream prefetch there."""
    k = ucf.compile(SPMV, formats={"A": "csr"}, target="c")
    assert {p.array.name for p in _prefetches(k)} == {"A1_crd", "A_vals"}
    assert len(_prefetches(k)) == 4  # a short row's walk, and a long row's blocks
    src = k.source
    assert f"INT64_C({DISTANCE // 8})" in src and f"INT64_C({DISTANCE // 4})" in src
    for formats in ({"A": "csr", "B": "csr", "C": "csr"}, {"A": "csr"}):
        other = ucf.compile("C(i,k) = A(i,j) * B(j,k)", formats=formats, target="c")
        assert not {"A1_crd", "A_vals"} & {p.array.name for p in _prefetches(other)}
        assert "KB ahead" not in other.cin


def test_the_switch_is_checked(monkeypatch):
    monkeypatch.setenv("UCF_STREAM_PREFETCH", "yes")
    with pytest.raises(UcfError, match="UCF_STREAM_PREFETCH='yes'"):
        ucf.compile(SPMV, formats={"A": "csr"})


@pytest.mark.parametrize("lengths", [[0, 7, 1, 40, 4, 0, 21], [0, 0], [3]])
def test_spmv_streams_under_asan(asan_cc, tmp_path, lengths):
    """Every prefetch here lands past the arrays (a few dozen entries, 8 KB ahead), on
    short rows and in a long row's blocks: ASan must see no access."""
    rng = np.random.default_rng(len(lengths))
    cols = 48
    m = _rows_matrix(rng, lengths, cols, np.float64)
    x = rng.standard_normal(cols)
    k = ucf.compile(SPMV, formats={"A": "csr"}, target="c")
    assert "__builtin_prefetch" in k.source
    ops = {"A": ucf.from_scipy(m, format="csr"), "x": ucf.from_numpy(x)}
    n = len(lengths)
    out = run_under_asan(asan_cc, tmp_path, k, "U", (n,), {"i": n, "j": cols}, ops)
    np.testing.assert_allclose(out.to_numpy(), m @ x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("fmt", "dtype"), [("dcsr", "float64"), ("csr", "float32")])
def test_dcsr_and_float32_rows_are_streamed_and_keep_their_values(fmt, dtype, monkeypatch):
    """DCSR's rows are positions of its first level, stepping by one too; float32 values
    are fetched the same bytes ahead (twice the positions)."""
    rng = np.random.default_rng(9)
    m = _rows_matrix(rng, [0, 3, 0, 40, 7, 1, 0, 17], 60, np.dtype(dtype).type)
    x = rng.standard_normal(60).astype(dtype)
    a = ucf.from_scipy(m, format=fmt)
    k = ucf.compile(SPMV, formats={"A": fmt}, dtype=dtype)
    assert "prefetch: A1_crd, A_vals of loop j" in k.cin
    monkeypatch.setenv("UCF_STREAM_PREFETCH", "0")
    plain = ucf.compile(SPMV, formats={"A": fmt}, dtype=dtype)
    y = np.asarray(k(A=a, x=x))
    assert np.array_equal(y, np.asarray(plain(A=a, x=x)))
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(y, m @ x, rtol=tol, atol=tol)
