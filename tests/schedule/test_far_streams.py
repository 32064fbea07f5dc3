"""The default's gate for ``streams(j, 2)`` (``ucf.schedule.far_streams``) and the
statistic it reads (``ucf.schedule.stats.gathers``): where a matrix's entries lie,
their median distance from the diagonal and the columns they spread over, against
the same measures computed by numpy over every entry; crafted statistics for each
rule, both ways; then calls whose ``k.cin`` says why, against scipy."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from ucf import pipeline
from ucf.format.format import parse_format
from ucf.passes.streams import DISTANCE
from ucf.schedule.stats import Stats, gathers

SPMV = "y(i) = A(i,j) * x(j)"
ROWS = 200_000


def _first(stats: Stats, dtype_bytes: int = 8, threads: int = 1) -> str:
    """The default's first proposal for ``stats`` (SpMV, A CSR)."""
    stats.itemsize.update({"A": dtype_bytes, "x": dtype_bytes})
    return pipeline.proposals(SPMV, {"A": parse_format("csr")}, stats, threads=threads)[0].text


def _stats(reach: float, columns: float, rows: int = ROWS) -> Stats:
    return Stats({"i": rows, "j": rows}, {"A": 10 * rows}, gathers={"A": (reach, columns)})


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("reach", "columns", "far"),
    [
        (58_000, 200_000, True),  # bench/peers.py's uniform rows: x read all over
        (4, 200_000, False),  # banded: each row reads x near where the last one did
        (244_000, 11_600, False),  # R-MAT: the entries crowd into 93 KB of x
        (512, 200_000, True),  # 4 KB of x either side of the diagonal
        (511, 200_000, False),
        (58_000, 32_768, True),  # 256 KB of columns
        (58_000, 32_767, False),
    ],
)
def test_the_gate(reach, columns, far, threads):
    assert ("streams(j, 2)" in _first(_stats(reach, columns), threads=threads)) is far


def test_the_gate_counts_bytes_of_x():
    """float32: half the bytes a column, so twice the columns and reach to pass."""
    assert "streams" in _first(_stats(1024, 65_536), dtype_bytes=4)
    assert "streams" not in _first(_stats(1023, 65_536), dtype_bytes=4)
    assert "streams" not in _first(_stats(1024, 65_535), dtype_bytes=4)


def test_no_statistic_no_command():
    """A matrix whose entries were not sampled (another format, a converted copy), and a
    call with no statistics (compiling before any call), keep the L1 prefetch."""
    stats = Stats({"i": ROWS, "j": ROWS}, {"A": 10 * ROWS}, itemsize={"A": 8, "x": 8})
    assert "streams" not in pipeline.proposals(SPMV, {"A": parse_format("csr")}, stats, 1)[0].text
    assert "streams" not in pipeline.proposals(SPMV, {"A": parse_format("csr")}, None, 1)[0].text


def test_key_follows_the_gate():
    """Two calls alike but where the entries lie: other keys, so the second is not given
    the first one's schedule."""
    far, near, crowded = _stats(58_000, 200_000), _stats(4, 200_000), _stats(58_000, 11_600)
    assert len({far.key(1), near.key(1), crowded.key(1)}) == 3


def _uniform(rng, rows: int, per: int) -> sp.csr_matrix:
    cols = np.sort(rng.integers(0, rows, size=(rows, per)), axis=1)
    indptr = np.arange(0, rows * per + 1, per)
    return sp.csr_matrix((rng.standard_normal(rows * per), cols.ravel(), indptr), (rows, rows))


def _banded(rng, rows: int, width: int) -> sp.csr_matrix:
    return sp.diags(
        [rng.standard_normal(rows) for _ in range(width)],
        list(range(-(width // 2), width - width // 2)),
        shape=(rows, rows),
        format="csr",
    )


def _power_law(rng, rows: int, per: int) -> sp.csr_matrix:
    """Columns drawn Zipf-like: most entries in a few columns, as R-MAT's."""
    cols = np.minimum(rng.zipf(1.3, size=rows * per) - 1, rows - 1)
    m = sp.csr_matrix(
        (rng.standard_normal(rows * per), (np.repeat(np.arange(rows), per), cols)), (rows, rows)
    )
    m.sum_duplicates()
    return m


def _measured(m: sp.csr_matrix) -> tuple[float, float]:
    """The two measures over every entry, by numpy."""
    rows = np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))
    reach = float(np.median(np.abs(m.indices - rows * (m.shape[1] / m.shape[0]))))
    p = np.bincount(m.indices, minlength=m.shape[1]) / m.nnz
    return reach, min(1.0 / float(np.sum(p * p)), m.shape[1])


@pytest.mark.parametrize("kind", ["uniform", "banded", "power law"])
def test_gathers_estimates_every_entry(kind):
    rng = np.random.default_rng(38)
    m = {"uniform": _uniform, "banded": _banded, "power law": _power_law}[kind](rng, 50_000, 10)
    reach, columns = gathers(ucf.from_scipy(m, format="csr"))
    want_reach, want_columns = _measured(m)
    assert reach == pytest.approx(want_reach, rel=0.05, abs=1.0)
    assert columns == pytest.approx(want_columns, rel=0.3)


def test_gathers_of_other_tensors():
    rng = np.random.default_rng(1)
    m = _uniform(rng, 300, 5)
    csc = gathers(ucf.from_scipy(m, format="csc"))  # rows of each column: the transpose's
    assert csc == gathers(ucf.from_scipy(sp.csr_matrix(m.T), format="csr"))
    assert gathers(ucf.from_scipy(sp.csr_matrix((5, 7)), format="csr")) is None
    assert gathers(ucf.from_scipy(m, format="dcsr")) is None
    assert gathers(ucf.from_numpy(np.ones((3, 3, 3)), format="CCC")) is None


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_calls_say_why_and_keep_the_values(target, threads, monkeypatch):
    """40k uniform rows of 10 (x of 320 KB) get the streams into the L2; banded rows
    keep them in the L1. Both against scipy, and bit for bit against the kernel
    without stream prefetches (a prefetch moves no value)."""
    rng = np.random.default_rng(5)
    k = ucf.compile(SPMV, formats={"A": "csr"}, target=target)
    monkeypatch.setenv("UCF_STREAM_PREFETCH", "0")
    plain = ucf.compile(SPMV, formats={"A": "csr"}, target=target)
    monkeypatch.delenv("UCF_STREAM_PREFETCH")
    for m, far in ((_uniform(rng, 40_000, 10), True), (_banded(rng, 40_000, 15), False)):
        x = rng.standard_normal(m.shape[1])
        a = ucf.from_scipy(m, format="csr")
        y = np.asarray(k(A=a, x=x))
        np.testing.assert_allclose(y, m @ x, rtol=1e-12, atol=1e-12)
        assert np.array_equal(y, np.asarray(plain(A=a, x=x)))
        assert ("streams(j, 2)" in (k.schedule_used or "")) is far
        assert (f"fetched {DISTANCE // 1024} KB ahead into the L2" in k.cin) is far
        assert ("default: streams(j, 2), since half of A's entries lie" in k.cin) is far
