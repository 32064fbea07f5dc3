"""Stream prefetches (ucf.passes.streams): SpMV's rows ask for their position streams'
lines ahead. Against scipy on both CPU targets at 1 and 2 threads, over empty rows, rows
of 1 to 7 (the remainders of a split chain), a single long row and power-law rows;
bit for bit between the targets and against the kernel without the pass (a prefetch
moves a line, never a value), into the L1 or, with ``streams(j, 2)``, the L2; the walks
fetched into the L1 starting a line of code on the llvm target, unless they stream
coordinates only (SpGEMM's count of its rows' bounds); where the prefetches
go (a row's own streams, not the rows SpGEMM walks at A's coordinates); and under
AddressSanitizer, where every prefetch of these small matrices points past the arrays'
ends."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import scipy.sparse as sp

import ucf
from tests.asan import run_under_asan
from tests.passes.test_partial_sums import LENGTHS, _rows_matrix
from ucf.errors import UcfError
from ucf.ir import nodes as ir
from ucf.ir.walk import nodes
from ucf.passes.streams import DISTANCE, LINE

SPMV = "y(i) = A(i,j) * x(j)"
SPGEMM = "C(i,k) = A(i,j) * B(j,k)"


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


@pytest.mark.parametrize("level", [None, 2])
def test_spmv_with_streams_matches_scipy_and_itself_without(threads, level, monkeypatch):
    """The default's prefetches, and those into the L2 (``streams(j, 2)``, ``level`` 2)."""
    rng = np.random.default_rng(38)
    operands = [(name, m, rng.standard_normal(m.shape[1])) for name, m in _matrices(rng).items()]
    par = "parallelize(i, CPUThread, NoRaces)" if threads > 1 else ""
    schedule = None if level is None else "; ".join(filter(None, [par, f"streams(j, {level})"]))
    got: dict[str, dict[str, np.ndarray]] = {}
    for target in ("llvm", "c"):
        k = ucf.compile(SPMV, formats={"A": "csr"}, target=target, schedule=schedule)
        monkeypatch.setenv("UCF_STREAM_PREFETCH", "0")
        plain = ucf.compile(SPMV, formats={"A": "csr"}, target=target)
        monkeypatch.delenv("UCF_STREAM_PREFETCH")
        for name, m, x in operands:
            a = ucf.from_scipy(m, format="csr")
            y = np.asarray(k(A=a, x=x))
            np.testing.assert_allclose(y, m @ x, rtol=1e-12, atol=1e-12, err_msg=name)
            assert np.array_equal(y, np.asarray(plain(A=a, x=x))), name
            got.setdefault(name, {})[target] = y
        if level is not None:
            assert {p.level for p in _prefetches(k)} == {level}
        assert "prefetch: A1_crd, A_vals of loop j" in k.cin
        assert "prefetch:" not in plain.cin
    for name, y in got.items():
        assert np.array_equal(y["llvm"], y["c"]), name


def test_a_rows_streams_are_fetched_and_no_others():
    """SpMV: each short row's walk fetches crd and vals ``DISTANCE`` bytes past its start,
    and each block of a long row's partial sums past the block. SpGEMM and SpMM walk A's
    rows with a loop in each step (B's row, the columns): no stream prefetch there, but
    in the count of each row's products that SpGEMM's parallel rows start with."""
    k = ucf.compile(SPMV, formats={"A": "csr"}, target="c")
    assert {p.array.name for p in _prefetches(k)} == {"A1_crd", "A_vals"}
    assert len(_prefetches(k)) == 4  # a short row's walk, and a long row's blocks
    src = k.source
    assert f"INT64_C({DISTANCE // 8})" in src and f"INT64_C({DISTANCE // 4})" in src
    for formats in ({"A": "csr", "B": "csr", "C": "csr"}, {"A": "csr"}):
        other = ucf.compile("C(i,k) = A(i,j) * B(j,k)", formats=formats, target="c")
        fetched = {p.array.name for p in _prefetches(other)}
        if "C" in formats:
            # its parallel rows first count their products (ucf.lower.row_chunks), a walk
            # of A's coordinates alone: that stream is fetched, the rows' walks are not
            assert "A_vals" not in fetched
            assert "prefetch: A1_crd of loop pb fetched" in other.cin
            continue
        assert not {"A1_crd", "A_vals"} & fetched
        assert "KB ahead" not in other.cin


def test_the_switch_is_checked(monkeypatch):
    monkeypatch.setenv("UCF_STREAM_PREFETCH", "yes")
    with pytest.raises(UcfError, match="UCF_STREAM_PREFETCH='yes'"):
        ucf.compile(SPMV, formats={"A": "csr"})


@pytest.mark.parametrize("lengths", [[0, 7, 1, 40, 4, 0, 21], [0, 0], [3]])
def test_spmv_streams_under_asan(asan_cc, tmp_path, lengths):
    """Every prefetch here lands past the arrays (a few dozen entries, 6 KB ahead), on
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


def test_streams_into_the_l2_are_the_same_prefetches():
    """``streams(j, 2)``: the prefetches of level 1, at level 2 (``prefetcht1``)."""
    far = ucf.compile(SPMV, formats={"A": "csr"}, schedule="streams(j, 2)")
    near = ucf.compile(SPMV, formats={"A": "csr"}, schedule="streams(j, 1)")
    assert {p.level for p in _prefetches(far)} == {2}
    assert {p.level for p in _prefetches(near)} == {1}
    assert [replace(p, level=1) for p in _prefetches(far)] == _prefetches(near)
    ahead = f"fetched {DISTANCE // 1024} KB ahead"
    assert f"{ahead} into the L2, row after row" in far.cin
    assert f"{ahead}, row after row" in near.cin


@pytest.mark.parametrize(("level", "locality"), [(1, 3), (2, 2)])
def test_the_level_in_each_target(level, locality):
    """llvm.prefetch's and __builtin_prefetch's locality: 3 into the L1 (prefetcht0),
    2 into the L2 (prefetcht1); the host assembly says which instruction."""
    llvm = ucf.compile(SPMV, formats={"A": "csr"}, schedule=f"streams(j, {level})")
    c = ucf.compile(SPMV, formats={"A": "csr"}, target="c", schedule=f"streams(j, {level})")
    assert llvm.source.count(f"i32 0, i32 {locality}, i32 1)") == 4
    assert c.source.count(f", 0, {locality});") == 4
    for k in (llvm, c):
        assert f"prefetcht{3 - locality}\t" in k.asm or f"prefetcht{3 - locality} " in k.asm


def test_streams_on_a_loop_without_streams_changes_nothing():
    """SpMM walks A's rows with a loop over the columns in each step: no stream
    prefetch, with or without the command."""
    spmm = "C(i,k) = A(i,j) * B(j,k)"
    plain = ucf.compile(spmm, formats={"A": "csr"}, target="c", schedule="")
    far = ucf.compile(spmm, formats={"A": "csr"}, target="c", schedule="streams(j, 2)")
    assert plain.source == far.source


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ("streams(j, 3)", r"streams\(j, 3\): the cache level is 1 .* or 2 .*, got 3"),
        ("streams(j, 0)", r"streams\(j, 0\): the cache level must be a positive integer"),
        ("streams(j)", r"streams takes 2 arguments, got 1"),
        ("streams(q, 2)", r"streams\(q, 2\): unknown index variable 'q'"),
    ],
)
def test_streams_refusals(schedule, message):
    with pytest.raises(ucf.ScheduleError, match=message):
        ucf.compile(SPMV, formats={"A": "csr"}, schedule=schedule)


@pytest.mark.parametrize("lengths", [[0, 7, 1, 40, 4, 0, 21], [3]])
def test_spmv_streams_into_the_l2_under_asan(asan_cc, tmp_path, lengths):
    """Level 2's prefetches land past the arrays as level 1's do: ASan sees no access."""
    rng = np.random.default_rng(len(lengths) + 83)
    cols = 48
    m = _rows_matrix(rng, lengths, cols, np.float64)
    x = rng.standard_normal(cols)
    k = ucf.compile(SPMV, formats={"A": "csr"}, target="c", schedule="streams(j, 2)")
    assert ", 0, 2);" in k.source
    ops = {"A": ucf.from_scipy(m, format="csr"), "x": ucf.from_numpy(x)}
    n = len(lengths)
    out = run_under_asan(asan_cc, tmp_path, k, "U", (n,), {"i": n, "j": cols}, ops)
    np.testing.assert_allclose(out.to_numpy(), m @ x, rtol=1e-12, atol=1e-12)


def _aligned(k) -> list[ir.For]:
    return [n for f in k.llir for n in nodes(f.body) if isinstance(n, ir.For) and n.align]


@pytest.mark.parametrize("threads", [1, 2])
def test_a_walk_into_the_l1_starts_a_line_of_code(threads, monkeypatch):
    """The walks fetched into the L1 (a short row's, a long row's blocks) start a 64-byte
    line of code on the llvm target (``llvm.loop.align``, ``.p2align 6`` in the host
    assembly, where LLVM would put an innermost loop at 16 bytes); walks fetched into the
    L2, and kernels without the stream prefetches, keep LLVM's placement."""
    par = "parallelize(i, CPUThread, NoRaces); " if threads > 1 else ""
    near = ucf.compile(SPMV, formats={"A": "csr"}, schedule=f"{par}streams(j, 1)")
    far = ucf.compile(SPMV, formats={"A": "csr"}, schedule=f"{par}streams(j, 2)")
    assert [loop.align for loop in _aligned(near)] == [LINE, LINE]
    assert near.source.count(f'!"llvm.loop.align", i32 {LINE}') == 2
    assert near.asm.count(".p2align\t6") == 2
    assert f"starts a {LINE}-byte line of code" in near.cin
    assert not _aligned(far) and "llvm.loop.align" not in far.source
    assert ".p2align\t6" not in far.asm and "line of code" not in far.cin
    monkeypatch.setenv("UCF_STREAM_PREFETCH", "0")
    plain = ucf.compile(SPMV, formats={"A": "csr"}, schedule=par.rstrip("; "))
    assert not _aligned(plain) and ".p2align\t6" not in plain.asm


@pytest.mark.parametrize("out", ["csr", "UQ"])
def test_a_walk_of_coordinates_only_keeps_llvms_placement(out):
    """SpGEMM on two threads counts each row's bound (the sum of B's row lengths over A's
    row) in a walk that streams A's coordinates only: it is fetched into the L1 but
    keeps LLVM's placement (its padding moved the fill loops after it, 2-3 % of the
    call), while SpMV's walk of values and coordinates starts a line; C matches scipy."""
    rng = np.random.default_rng(7)
    m = sp.random(3000, 3000, density=0.003, format="csr", random_state=rng)
    a = ucf.from_scipy(m, format="csr")
    ucf.set_num_threads(2)  # conftest restores it
    k = ucf.compile(SPGEMM, formats={"A": "csr", "B": "csr", "C": out})
    got = k(A=a, B=a).to_scipy()
    spmv = ucf.compile(SPMV, formats={"A": "csr"})
    spmv(A=a, x=ucf.from_numpy(rng.random(3000)))
    np.testing.assert_allclose(got.toarray(), (m @ m).toarray(), rtol=1e-12, atol=1e-12)
    assert [p.array.name for p in _prefetches(k)].count("A1_crd") == 1
    assert "prefetch: A1_crd of loop" in k.cin and "line of code" not in k.cin
    assert not _aligned(k) and "llvm.loop.align" not in k.source
    assert _aligned(spmv) and {loop.align for loop in _aligned(spmv)} == {LINE}
