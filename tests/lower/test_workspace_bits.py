"""A sorted sparse output's row workspace read from its bitmap (``ucf.lower.workspaces``):
rows as dense as the bitmap's words come out of it in order (every word, or the words
its summary marks), sparser ones are sorted, and a row sets the bitmap when the row
before it was dense. Checked against scipy, with each
row's coordinates sorted and unique, on both CPU targets."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import ucf
from ucf.ir import nodes as ir
from ucf.ir.walk import nodes

SPGEMM = "C(i,j) = A(i,k)*B(k,j)"


def _check(got, want, fmt: str) -> None:
    """``got`` (a ucf result of format ``fmt``) equals scipy's ``want``, and, for a CSR
    or CSC result (scipy's arrays on its own), every segment's coordinates strictly
    increase."""
    g = got.to_scipy()
    if fmt in ("csr", "csc"):
        assert g.format == fmt
        for r in range(len(g.indptr) - 1):
            seg = g.indices[g.indptr[r] : g.indptr[r + 1]]
            assert (np.diff(seg) > 0).all(), f"segment {r} not sorted and unique: {seg}"
    np.testing.assert_allclose(g.toarray(), want.toarray(), rtol=1e-12, atol=1e-12)


def _rows(n_rows: int, cols: int, lengths: list[int], seed: int) -> sp.csr_matrix:
    """A CSR matrix whose rows hold ``lengths`` entries (cycled) in random columns."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(n_rows):
        m = min(lengths[r % len(lengths)], cols)
        rows.append(np.sort(rng.choice(cols, m, replace=False)))
    pos = np.concatenate([[0], np.cumsum([len(x) for x in rows])]).astype(np.int32)
    crd = np.concatenate(rows).astype(np.int32) if pos[-1] else np.zeros(0, np.int32)
    return sp.csr_matrix((rng.random(pos[-1]) + 0.5, crd, pos), (n_rows, cols))


def test_default_spgemm_reads_a_bitmap_and_unordered_output_does_not():
    def bits(fmt: str) -> bool:
        k = ucf.compile(SPGEMM, formats={"A": "csr", "B": "csr", "C": fmt})
        a = ucf.from_scipy(_rows(8, 8, [2], 0))
        k(A=a, B=a)
        fns = [f for f in k.llir if f.name == "kernel"]
        return any(isinstance(e, ir.Bits) for s in fns[0].body for e in nodes(s))

    assert bits("csr")
    assert not bits("UQ")  # taken as it arrives: nothing to order


@pytest.mark.parametrize(
    "lengths",
    [
        [40, 0, 1, 40, 40, 2, 0, 0, 40],  # dense rows, then sparse, empty, dense again
        [1],  # every row far sparser than its words: the sort alone
        [2000],  # full rows of B: every column of C in each row
    ],
)
def test_rows_switch_between_bitmap_and_sort(target, lengths):
    """2000 columns make 32 words: a row of C from one entry of A (~10 columns) sorts,
    one from 40 reads the bitmap; the choice follows the row before."""
    a = _rows(300, 500, [x and max(1, x // 10) for x in lengths], 1)
    b = _rows(500, 2000, [10, 1, 0, 2000 if 2000 in lengths else 10], 2)
    k = ucf.compile(SPGEMM, formats={"A": "csr", "B": "csr", "C": "csr"}, target=target)
    _check(k(A=ucf.from_scipy(a), B=ucf.from_scipy(b)), a @ b, "csr")


@pytest.mark.parametrize("seed", [8, 9])
def test_marked_words_over_several_summary_words(target, seed):
    """10,000 columns make 157 words and 3 summary words: a row of C of about 50
    reads the words its summary marks, one of about 200 every word, one of about 10
    sorts; rows of each kind follow rows of each other kind."""
    a = _rows(400, 600, [5, 5, 20, 1, 5, 0, 20, 20, 1, 1, 5], seed)
    b = _rows(600, 10_000, [10], seed + 1)
    k = ucf.compile(SPGEMM, formats={"A": "csr", "B": "csr", "C": "csr"}, target=target)
    _check(k(A=ucf.from_scipy(a), B=ucf.from_scipy(b)), a @ b, "csr")


@pytest.mark.parametrize(
    "fa, fb, fc",
    [
        ("csr", "csr", "dcsr"),
        ("dcsr", "csr", "csr"),
        ("coo", "csr", "csr"),
        ("dense", "csr", "csr"),
        ("csc", "csc", "csc"),
        ("csr", "csc", "csr"),
    ],
)
@pytest.mark.filterwarnings("ignore::ucf.ConversionWarning")
def test_formats_rectangular_and_empty(target, fa, fb, fc):
    """Rectangular operands with empty rows and columns, in several formats; the
    bitmap's last word is partial (70 columns)."""
    a = _rows(33, 20, [3, 0, 7, 1], 3)
    a = sp.csr_matrix(a.toarray() * (np.arange(20) % 5 != 2))  # empty columns
    b = _rows(20, 70, [9, 0, 30, 1], 4)
    ops = {"A": ucf.from_scipy(a, format=fa), "B": ucf.from_scipy(b, format=fb)}
    k = ucf.compile(SPGEMM, formats={"A": fa, "B": fb, "C": fc}, target=target)
    _check(k(**ops), a @ b, fc)


def test_a_single_long_row(target):
    """One row of C over every column (the list full, the bitmap's reading writing its
    candidates past the last), beside an empty one."""
    a = sp.csr_matrix(np.array([[1.0] * 50, [0.0] * 50]))
    b = _rows(50, 3000, [80], 5)
    k = ucf.compile(SPGEMM, formats={"A": "csr", "B": "csr", "C": "csr"}, target=target)
    for _ in range(2):  # the second call's first row reads the bitmap
        _check(k(A=ucf.from_scipy(a), B=ucf.from_scipy(b)), a @ b, "csr")


def test_llvm_and_c_agree_exactly():
    a, b = _rows(200, 300, [5, 30, 0, 1], 6), _rows(300, 900, [6, 0, 40], 7)
    got = []
    for target in ("llvm", "c"):
        k = ucf.compile(SPGEMM, formats={"A": "csr", "B": "csr", "C": "csr"}, target=target)
        c = k(A=ucf.from_scipy(a), B=ucf.from_scipy(b)).to_scipy()
        got.append((c.indptr, c.indices, c.data))
    for x, y in zip(*got, strict=True):
        np.testing.assert_array_equal(x, y)


_KERNEL = {}


@settings(max_examples=40)
@given(
    rows=st.integers(0, 40),
    inner=st.integers(1, 40),
    cols=st.integers(1, 700),
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_hypothesis_against_scipy(rows, inner, cols, lengths, seed):
    if "k" not in _KERNEL:
        _KERNEL["k"] = ucf.compile(SPGEMM, formats={"A": "csr", "B": "csr", "C": "csr"})
    a = _rows(rows, inner, lengths, seed)
    b = _rows(inner, cols, lengths[::-1], seed + 1)
    _check(_KERNEL["k"](A=ucf.from_scipy(a), B=ucf.from_scipy(b)), a @ b, "csr")


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_two_threads_keep_their_own_bitmap_mode(target):
    """Each thread's rows switch among the bitmap's paths by their own previous row (the
    mode lives in the thread's flags): rows of mixed densities shared out to 2 threads,
    by the default and by a dynamic schedule, stay exact and sorted."""
    ucf.set_num_threads(2)
    a = _rows(600, 300, [1, 40, 3, 120, 0, 9], 7)
    b = _rows(300, 5000, [2, 60, 5], 8)
    want = a @ b
    for schedule in (
        None,
        "precompute(A(i,k)*B(k,j),j,j,w); parallelize(i, CPUThread, NoRaces)",
    ):
        k = ucf.compile(
            SPGEMM,
            formats={"A": "csr", "B": "csr", "C": "csr"},
            schedule=schedule,
            target=target,
        )
        _check(k(A=a, B=b), want, "csr")
