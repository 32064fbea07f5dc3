"""SDDMM ``A(i,j) = B(i,j)*C(i,k)*D(k,j)`` with D row-major: the default reads a copy of
D laid out as its loops walk it (``convert(D)`` on a dense operand,
``ucf.schedule.strided_operands``, the copy by ``ucf.format.relayout``), checked
against numpy and scipy on both CPU targets over D's two layouts, K of 1, 3, 64 and 65
(the dot product's vector remainders), empty rows and one long row, float32 and
float64, one and two threads; a user's schedule is kept, and bad operands are named."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.helpers import TARGETS
from ucf.errors import ScheduleError, UcfError
from ucf.format.relayout import relaid
from ucf.schedule import cpu_model, strided_operands

SDDMM = "A(i,j) = B(i,j) * C(i,k) * D(k,j)"
LAYOUTS = {"row": "UU", "col": "UU:1,0"}


def mask(shape, seed: int, long_row: bool = False) -> sp.csr_matrix:
    """B: about 6 entries a row, every third row empty, and optionally one full row."""
    rng = np.random.default_rng(seed)
    b = sp.random(*shape, density=6 / shape[1], random_state=rng, format="lil")
    b[::3] = 0
    if long_row:
        b[1] = rng.random(shape[1])
    b = b.tocsr()
    b.eliminate_zeros()
    return b


def reference(b: sp.csr_matrix, c: np.ndarray, d: np.ndarray) -> np.ndarray:
    return b.multiply(c @ d).toarray()


@pytest.fixture
def copies_pay(monkeypatch):
    """The default's thresholds down to nothing, so small operands take the copy."""
    monkeypatch.setattr(strided_operands, "MIN_ENTRIES", 0)
    monkeypatch.setattr(cpu_model, "REPLAN_WORK", 0)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("kdim", [1, 3, 64, 65])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sddmm_default_against_scipy(copies_pay, target, layout, kdim, dtype):
    rng = np.random.default_rng(kdim)
    b = mask((37, 29), kdim, long_row=kdim == 3)
    c = rng.uniform(-1, 1, (37, kdim)).astype(dtype)
    d = rng.uniform(-1, 1, (kdim, 29)).astype(dtype)
    fd = LAYOUTS[layout]
    k = ucf.compile(SDDMM, formats={"A": "csr", "B": "csr", "D": fd}, target=target, dtype=dtype)
    dd = ucf.from_numpy(d, format=fd, dtype=dtype)
    bt = ucf.from_scipy(b.astype(dtype), format="csr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)
        got = k(B=bt, C=c, D=dd)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got.to_scipy().toarray(), reference(b, c, d), rtol=tol, atol=tol)
    copied = "convert(D)" in k.cin
    assert copied == (layout == "row" and kdim > 1), k.cin  # K = 1: D is a vector, unstrided


def test_llvm_and_c_agree_bit_for_bit(copies_pay, threads):
    """The copy changes no rounding: llvm and c give the same bits, and the row-major
    default the same bits as the column-major one, on one thread and on two (the
    ``threads`` fixture)."""
    rng = np.random.default_rng(7)
    b = mask((300, 250), 7, long_row=True)
    c, d = rng.uniform(-1, 1, (300, 64)), rng.uniform(-1, 1, (64, 250))
    got = {}
    for target in ("llvm", "c"):
        for layout, fd in LAYOUTS.items():
            k = ucf.compile(SDDMM, formats={"A": "csr", "B": "csr", "D": fd}, target=target)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ucf.ConversionWarning)
                r = k(B=b, C=c, D=ucf.from_numpy(d, format=fd))
            got[target, layout] = r.to_scipy().toarray()
            assert ("convert(D)" in k.cin) == (layout == "row")
    first = got["llvm", "col"]
    for v in got.values():
        np.testing.assert_array_equal(v, first)
    np.testing.assert_allclose(first, reference(b, c, d), rtol=1e-12, atol=1e-12)


def test_without_statistics_or_below_the_thresholds_nothing_is_copied():
    """Compiled before a call, and called on a small D, the kernel reads D as stored."""
    k = ucf.compile(SDDMM, formats={"A": "csr", "B": "csr", "D": "UU"})
    assert "convert(D)" not in k.cin
    rng = np.random.default_rng(1)
    b = mask((60, 50), 1)
    c, d = rng.random((60, 64)), rng.random((64, 50))
    got = k(B=b, C=c, D=d)
    assert "convert(D)" not in k.cin
    np.testing.assert_allclose(got.to_scipy().toarray(), reference(b, c, d), rtol=1e-12)


def test_a_user_schedule_is_kept(copies_pay):
    """An explicit schedule is honoured: without convert(D) D is read as stored; with it,
    copied; convert of a dense operand the loops walk as stored is refused."""
    rng = np.random.default_rng(2)
    b = mask((40, 30), 2)
    c, d = rng.random((40, 16)), rng.random((16, 30))
    fmts = {"A": "csr", "B": "csr", "D": "UU"}
    plain = ucf.compile(SDDMM, formats=fmts, schedule="parallelize(i, CPUThread, NoRaces)")
    copied = ucf.compile(SDDMM, formats=fmts, schedule="convert(D)")
    got = plain(B=b, C=c, D=d)
    assert "convert(D)" not in plain.cin and "copied to 'UU:1,0'" in copied.cin
    with pytest.warns(ucf.ConversionWarning, match="operand D"):
        again = copied(B=b, C=c, D=d)
    want = reference(b, c, d)
    for r in (got, again):
        np.testing.assert_allclose(r.to_scipy().toarray(), want, rtol=1e-12)
    with pytest.raises(ScheduleError, match="walk dense operand C"):
        ucf.compile(SDDMM, formats=fmts, schedule="convert(C)")


@pytest.mark.parametrize(
    ("stmt", "d", "why"),
    [
        (SDDMM, "dense@bfloat16", "holds encoded values"),
        ("A(i,j) = B(i,j) * C(i,k) * D(k+1,j)", "UU", "indexed by expressions"),
    ],
)
def test_convert_says_why_it_cannot_copy(stmt, d, why):
    """A dense operand convert does not copy is refused for that reason, not as one the
    loops walk as stored (which they do not)."""
    with pytest.raises(ScheduleError, match=why):
        ucf.compile(stmt, formats={"A": "csr", "B": "csr", "D": d}, schedule="convert(D)")


def test_bad_operands_are_named(copies_pay):
    rng = np.random.default_rng(3)
    b = mask((40, 30), 3)
    c = rng.random((40, 16))
    k = ucf.compile(SDDMM, formats={"A": "csr", "B": "csr", "D": "UU"}, schedule="convert(D)")
    with pytest.raises(UcfError, match="D"):
        k(B=b, C=c, D=rng.random((30, 16)))  # D given transposed
    with pytest.raises(UcfError, match="D"):
        k(B=b, C=c, D=rng.random((16, 31)))
    with pytest.raises(UcfError, match="D"):
        k(B=b, C=c, D=rng.random((16, 30, 1)))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(
    "shape,stored,to",
    [
        ((64, 5000), (0, 1), (1, 0)),
        ((7, 0), (0, 1), (1, 0)),
        ((3, 4, 5000), (0, 1, 2), (2, 0, 1)),
        ((3, 4, 5), (2, 1, 0), (0, 1, 2)),
    ],
)
def test_relaid_against_numpy(threads, shape, stored, to, monkeypatch):
    """The blocked, threaded copy: every entry where numpy's transpose puts it (blocks
    small enough that every thread gets some)."""
    from ucf.format import relayout
    from ucf.format.format import Format

    monkeypatch.setattr(relayout, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(relayout, "BLOCK_BYTES", 4096)
    x = np.random.default_rng(4).random(shape)
    src = np.ascontiguousarray(x.transpose(stored))
    got = relaid(
        src.reshape(-1),
        shape,
        Format.dense(len(shape), stored),
        Format.dense(len(shape), to),
        np.dtype(np.float32),
        threads,
    )
    want = x.transpose(to).astype(np.float32)
    np.testing.assert_array_equal(got.reshape(want.shape), want)
    t = ucf.from_numpy(x, format=Format.dense(len(shape), stored))
    np.testing.assert_array_equal(t.convert(Format.dense(len(shape), to)).to_numpy(), x)


def test_the_copied_operand_under_asan(asan_cc, tmp_path):
    """The kernel that reads the copy stays inside it (a saved kernel under ASan, given D
    as the copy the call makes, under the name of the slot the kernel reads)."""
    from tests.asan import run_under_asan

    rng = np.random.default_rng(5)
    b = mask((23, 19), 5, long_row=True)
    c, d = rng.random((23, 65)), rng.random((65, 19))
    k = ucf.compile(
        SDDMM, formats={"A": "csr", "B": "csr", "D": "UU"}, schedule="convert(D)", target="c"
    )
    ops = {
        "B": ucf.from_scipy(b),
        "C": ucf.from_numpy(c),
        "D_as1": ucf.from_numpy(d).convert("UU:1,0"),
    }
    out = run_under_asan(asan_cc, tmp_path, k, "csr", b.shape, {"i": 23, "j": 19, "k": 65}, ops)
    np.testing.assert_allclose(out.to_scipy().toarray(), reference(b, c, d), rtol=1e-12)
