"""TeSA storage kernels under AddressSanitizer: blocked (bcsr, bcsc, block DCSR, a
transposed block order), fixed-width (ell, nm), quantized and half-precision operands,
with the register-tiled micro-kernels, paired 8-bit products and converted broadcast
factors they run, on extents the blocks do not divide (the padded split) and on
empty and full matrices.

Each case calls the kernel from Python once and records what ucf hands the compiled
function (extents, the split operands, the output's shape), then runs the saved C
kernel on exactly-sized heap copies of those arrays under ASan. Its output must equal
the Python call's, which must match numpy."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import ucf
from tests.asan import run_under_asan
from ucf.exec.kernel import Kernel
from ucf.passes import pairs, panels
from ucf.schedule import block_rows

SPMM = "C(i,j) = A(i,k) * B(k,j)"
SPMV = "y(i) = A(i,k) * x(k)"


def _recorded(monkeypatch, kernel: Kernel, **operands):
    """(extents, operands as split, output) of the compute function's one call, and
    the call's result."""
    seen = []
    real = Kernel._invoke

    def record(self, fn, extents, slots, output, counts=None):
        if fn.name == "kernel":
            seen.append((dict(extents), dict(slots), output))
        return real(self, fn, extents, slots, output, counts)

    with monkeypatch.context() as m:
        m.setattr(Kernel, "_invoke", record)
        result = kernel(**operands)
    assert len(seen) == 1
    return (*seen[0], result)


def _check(monkeypatch, asan_cc, tmp_path, kernel, expected, rtol=1e-5, threads=1, **operands):  # noqa: F811
    extents, slots, output, result = _recorded(monkeypatch, kernel, **operands)
    np.testing.assert_allclose(np.asarray(result), expected, rtol=rtol, atol=rtol)
    under = run_under_asan(
        asan_cc, tmp_path, kernel, "dense", output.shape, extents, slots, threads
    ).vals.reshape(output.shape)
    np.testing.assert_allclose(under, np.asarray(output.vals).reshape(output.shape), rtol=rtol)


def _block_sparse(rng, shape, block, density, dtype=np.float32) -> np.ndarray:
    """Blocks live with ``density``, every element of a live block nonzero, cut to
    ``shape`` (a partial block at the edges)."""
    grid = [-(-n // b) for n, b in zip(shape, block, strict=True)]
    live = np.kron(rng.random(grid) < density, np.ones(block))[: shape[0], : shape[1]]
    return (live * (rng.random(shape) + 0.5)).astype(dtype)


CASES = {"partial": 0.4, "empty": 0.0, "full": 1.0}


BLOCKED = [
    *(("bcsr(8,8)", d) for d in CASES),
    *((f, "partial") for f in ("bcsc(8,4)", "bdcsr(4,8)", "UCUU:1/8,0/8,1%8,0%8")),
]


@pytest.mark.parametrize(("fmt", "case"), BLOCKED)
def test_blocked_spmm(monkeypatch, asan_cc, tmp_path, fmt, case):  # noqa: F811
    """Extents of 20 x 27 over blocks of 8 leave partial blocks; 37 columns of B leave
    a tail after the register tiles of 16 columns (32 where the host has AVX-512F, whose
    tiles are 64-byte vectors)."""
    rng = np.random.default_rng(1)
    a = _block_sparse(rng, (20, 27), (8, 8), CASES[case])
    b = rng.standard_normal((27, 37)).astype(np.float32)
    k = ucf.compile(SPMM, formats={"A": fmt}, target="c", dtype="float32")
    _check(monkeypatch, asan_cc, tmp_path, k, a @ b, A=ucf.from_numpy(a, format=fmt), B=b)


@pytest.mark.parametrize(
    "held, cols", [(None, 69), (1, 69), (None, 64)], ids=["every-panel", "one-slot", "no-tail"]
)
def test_blocked_spmm_panels_packed_once_per_call(monkeypatch, asan_cc, tmp_path, held, cols):  # noqa: F811
    """B's panels packed once per call into a cache of slots with tags: 5 block rows (one
    empty, the last partial) over 5 block columns (the last partial), 2 tiles of columns
    and a tail; every panel held (in the team's cache: the loop over block rows is
    parallel), or one slot of a thread's own that every block column shares. Each tile
    prefetches the next block's panel (however few bytes the panels hold). Without the
    tail (64 columns, whole tiles) the first block of each whole block row writes its
    rows of C from zeroed registers, and the rest are zeroed (``first_write``)."""
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path / "cache"))  # CACHE_BYTES not in the key
    monkeypatch.setattr(block_rows, "NEAR_BYTES", 0)
    monkeypatch.setattr(block_rows, "IN_PLACE_USES", 0)  # packed, however few blocks a column
    if held is not None:
        monkeypatch.setattr(panels, "CACHE_BYTES", 1)  # a slot: fewer bytes than a panel
        monkeypatch.setattr(panels, "TEAM_BYTES", 0)  # each thread's own cache
    rng = np.random.default_rng(5)
    a = _block_sparse(rng, (75, 37), (16, 8), 0.7)
    a[16:32] = 0
    b = rng.standard_normal((37, cols)).astype(np.float32)
    k = ucf.compile(SPMM, formats={"A": "bcsr(16,8)"}, target="c", dtype="float32")
    assert "packed once per call and team for each k_blk" in k.cin
    assert "slice_covered" in k.c_source
    _check(monkeypatch, asan_cc, tmp_path, k, a @ b, A=ucf.from_numpy(a, format="bcsr(16,8)"), B=b)


@pytest.mark.parametrize("threads", [1, 2])
def test_b_read_in_place_in_bounds(monkeypatch, asan_cc, tmp_path, threads):  # noqa: F811
    """B's rows read in place instead of packed (``block_rows.IN_PLACE_USES``), with the next
    block's rows prefetched across block rows: 16 block rows over 8 block columns (the
    last partial), 16 to 32 blocks (at most 4 a column, and work enough for a team),
    4 tiles of columns and a tail, on one thread and on the team of two; the panels'
    bytes bound made 0 so that these small panels qualify."""
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path / "cache"))  # NEAR_BYTES not in the key
    monkeypatch.setattr(block_rows, "NEAR_BYTES", 0)
    rng = np.random.default_rng(8)
    a = _block_sparse(rng, (256, 61), (16, 8), 0.2)
    a[16:32] = 0
    t = ucf.from_numpy(a, format="bcsr(16,8)")
    assert 16 <= len(t.arrays[1]) <= 32
    b = rng.standard_normal((61, 133)).astype(np.float32)
    schedule = "reorder(i_blk,k_blk,i_in,k_in,j)"
    if threads == 2:  # the plan on two threads before any call: block rows halved
        schedule = "parallelize(i_blk, CPUThread, NoRaces)"
    k = ucf.compile(
        SPMM, formats={"A": "bcsr(16,8)"}, target="c", dtype="float32", schedule=schedule
    )
    assert "read in place, not packed" in k.cin
    _check(monkeypatch, asan_cc, tmp_path, k, a @ b, threads=threads, A=t, B=b)


def test_two_threads_share_the_panels_in_bounds(monkeypatch, asan_cc, tmp_path):  # noqa: F811
    """The team's cache of panels on two threads (work above the loop's threshold for
    a team): 16 block rows, the first 4 full, over 8 block columns (the last partial),
    the threads claiming and waiting for each other's panels."""
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(6)
    a = _block_sparse(rng, (256, 61), (16, 8), 0.5)
    a[:64] = rng.random((64, 61)) + 0.5
    b = rng.standard_normal((61, 133)).astype(np.float32)
    k = ucf.compile(
        SPMM,
        formats={"A": "bcsr(16,8)"},
        target="c",
        dtype="float32",
        schedule="split(i_blk, i_blk_c, i_blk_r, 1); parallelize(i_blk_c, CPUThread, NoRaces)",
    )
    assert "packed once per call and team for each k_blk" in k.cin
    operands = {"A": ucf.from_numpy(a, format="bcsr(16,8)"), "B": b}
    _check(monkeypatch, asan_cc, tmp_path, k, a @ b, threads=2, **operands)


@pytest.mark.parametrize("threads", [1, 2])
def test_huge_page_panels_in_bounds(monkeypatch, asan_cc, tmp_path, threads):  # noqa: F811
    """A cache of panels that takes huge pages (``ir.Alloc.huge``) starts up to a huge
    page past what malloc gave, which was asked for a huge page more: in bounds, with
    the huge page made 4 KB so that these panels (a few tens of KB) take them, on one
    thread (a thread's own cache) and two (the team's)."""
    from ucf.ir import nodes as ir

    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path / "cache"))  # HUGE_BYTES not in the key
    monkeypatch.setattr(ir, "HUGE_BYTES", 4096)
    rng = np.random.default_rng(7)
    a = _block_sparse(rng, (256, 61), (16, 8), 0.5)
    a[:64] = rng.random((64, 61)) + 0.5
    b = rng.standard_normal((61, 133)).astype(np.float32)
    schedule = "reorder(i_blk,k_blk,i_in,k_in,j)"  # no parallel loop: a thread's own cache
    if threads == 2:
        schedule = "split(i_blk, i_blk_c, i_blk_r, 1); parallelize(i_blk_c, CPUThread, NoRaces)"
    k = ucf.compile(
        SPMM, formats={"A": "bcsr(16,8)"}, target="c", dtype="float32", schedule=schedule
    )
    assert "ucf_huge_start(" in k.c_source
    operands = {"A": ucf.from_numpy(a, format="bcsr(16,8)"), "B": b}
    _check(monkeypatch, asan_cc, tmp_path, k, a @ b, threads=threads, **operands)


@pytest.mark.parametrize("density", [0.4, 0.0], ids=["partial", "empty"])
def test_quantized_blocks_converted_once_per_row_group(monkeypatch, asan_cc, tmp_path, density):  # noqa: F811
    """``bcsr@qint8:1`` (a scale per block) times float32: the dequantized block is the
    broadcast factor, converted into a buffer once per group of rows."""
    rng = np.random.default_rng(2)
    a = _block_sparse(rng, (19, 24), (8, 8), density) - 1.0 * (density > 0)
    a[a == -1.0] = 0.0
    b = rng.standard_normal((24, 21)).astype(np.float32)
    t = ucf.quantize(a, format="bcsr(8,8)@qint8:1")
    k = ucf.compile(SPMM, formats={"A": "bcsr(8,8)@qint8:1"}, target="c", dtype="float32")
    assert "converted once per group" in k.cin
    _check(monkeypatch, asan_cc, tmp_path, k, t.to_numpy() @ b, rtol=1e-4, A=t, B=b)


@pytest.mark.parametrize("density", [0.4, 1.0], ids=["partial", "full"])
def test_int8_blocks_times_uint8_in_pairs(monkeypatch, asan_cc, tmp_path, density):  # noqa: F811
    """``bcsr@int8`` times ``dense@uint8`` into int32: k steps paired for pmaddwd, an odd
    block width's last step alone; exact against numpy's integers."""
    rng = np.random.default_rng(3)
    live = _block_sparse(rng, (18, 30), (6, 6), density) != 0
    a = np.where(live, rng.integers(-128, 128, live.shape), 0).astype(np.int8)
    b = rng.integers(0, 256, (30, 19)).astype(np.uint8)
    fmts = {"A": "bcsr(6,6)@int8", "B": "dense@uint8"}
    k = ucf.compile(SPMM, formats=fmts, target="c", dtype="int32")
    expected = a.astype(np.int64) @ b.astype(np.int64)
    _check(monkeypatch, asan_cc, tmp_path, k, expected, A=ucf.from_numpy(a, format=fmts["A"]), B=b)


def test_int8_blocks_times_uint8_in_wide_quads(monkeypatch, asan_cc, tmp_path):  # noqa: F811
    """``bcsr@int8`` times ``dense@uint8`` in quads tiles of 16 int32 lanes (a host with
    AVX-512 VNNI; forced here, whatever this host is) of 8 rows: partial blocks, an empty
    block row, 70 columns (2 tiles of 32 and 6 left), blocks 7 wide (the last quad a
    step short); B's words in a cache of one slot, which every block column shares."""
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path / "cache"))  # CACHE_BYTES not in the key
    monkeypatch.setattr(panels, "CACHE_BYTES", 1)  # a slot: fewer bytes than a panel
    monkeypatch.setattr(panels, "TEAM_BYTES", 0)  # each thread's cache, in a team too
    monkeypatch.setattr(pairs, "available", lambda: (pairs.PMADDWD, pairs.VPDPBUSD))
    monkeypatch.setattr(pairs, "_avx512_vnni", lambda: True)
    rng, block = np.random.default_rng(5), (8, 7)
    live = _block_sparse(rng, (37, 45), block, 0.7) != 0
    a = np.where(live, rng.integers(-128, 128, live.shape), 0).astype(np.int8)
    a[block[0] : 2 * block[0]] = 0
    b = rng.integers(0, 256, (45, 70)).astype(np.uint8)
    fmts = {"A": "bcsr(8,7)@int8", "B": "dense@uint8"}
    k = ucf.compile(SPMM, formats=fmts, target="c", dtype="int32")
    assert "ucf_quaddot_i32x16" in k.c_source
    assert re.search(
        r"once per call and (thread|team \(where the words exceed 0 MB, thread\)) for each k_blk",
        k.cin,
    )
    expected = a.astype(np.int64) @ b.astype(np.int64)
    _check(monkeypatch, asan_cc, tmp_path, k, expected, A=ucf.from_numpy(a, format=fmts["A"]), B=b)


@pytest.mark.parametrize("quads", [True, False], ids=["quads", "pairs"])
def test_two_threads_share_the_8bit_words_in_bounds(monkeypatch, asan_cc, tmp_path, quads):  # noqa: F811
    """int8 x uint8 block products on two threads with B's words in the team's cache
    (quads as on a VNNI host, or pairs, forced whatever this host is): 16 block rows,
    the first 4 full, over 8 block columns (the last partial), the threads claiming and
    waiting for each other's words."""
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path / "cache"))
    extra = (pairs.VPDPBUSD,) if quads else ()
    monkeypatch.setattr(pairs, "available", lambda: (pairs.PMADDWD, *extra))
    rng = np.random.default_rng(7)
    live = _block_sparse(rng, (256, 61), (16, 8), 0.5) != 0
    live[:64] = True
    a = np.where(live, rng.integers(-128, 128, live.shape), 0).astype(np.int8)
    b = rng.integers(0, 256, (61, 133)).astype(np.uint8)
    fmts = {"A": "bcsr(16,8)@int8", "B": "dense@uint8"}
    k = ucf.compile(
        SPMM,
        formats=fmts,
        target="c",
        dtype="int32",
        schedule="split(i_blk, i_blk_c, i_blk_r, 1); parallelize(i_blk_c, CPUThread, NoRaces)",
    )
    assert "once per call and team (where the words exceed" in k.cin
    assert ("ucf_quaddot" in k.c_source) == quads
    expected = a.astype(np.int64) @ b.astype(np.int64)
    operands = {"A": ucf.from_numpy(a, format=fmts["A"]), "B": b}
    _check(monkeypatch, asan_cc, tmp_path, k, expected, threads=2, **operands)


@pytest.mark.parametrize("width", [1, 5])
def test_ell_spmv_and_spmm_in_row_groups(monkeypatch, asan_cc, tmp_path, width):  # noqa: F811
    """Rows of ``width`` entries (some padded with explicit zeros), 4 rows summed side by
    side, 13 rows leaving a partial group."""
    rng = np.random.default_rng(width)
    a = np.zeros((13, 17), np.float32)
    for r in range(13):
        cols = rng.choice(17, size=rng.integers(0, width + 1), replace=False)
        a[r, cols] = rng.random(len(cols)) + 0.5
    t = ucf.from_numpy(a, format=f"ell({width})")
    x, b = rng.random(17).astype(np.float32), rng.random((17, 9)).astype(np.float32)
    fmt = {"A": f"ell({width})"}
    spmv = ucf.compile(SPMV, formats=fmt, target="c", dtype="float32")
    _check(monkeypatch, asan_cc, tmp_path / "v", spmv, a @ x, A=t, x=x)
    spmm = ucf.compile(SPMM, formats=fmt, target="c", dtype="float32")
    _check(monkeypatch, asan_cc, tmp_path / "m", spmm, a @ b, A=t, B=b)


def test_two_of_four_spmm(monkeypatch, asan_cc, tmp_path):  # noqa: F811
    """``nm(2,4)`` with 22 columns: the last group of 4 is partial."""
    rng = np.random.default_rng(4)
    a = np.zeros((9, 22), np.float32)
    for r in range(9):
        for g in range(0, 22, 4):
            keep = rng.choice(np.arange(g, min(g + 4, 22)), size=min(2, 22 - g), replace=False)
            a[r, keep] = rng.random(len(keep)) + 0.5
    b = rng.random((22, 11)).astype(np.float32)
    k = ucf.compile(SPMM, formats={"A": "nm(2,4)"}, target="c", dtype="float32")
    _check(monkeypatch, asan_cc, tmp_path, k, a @ b, A=ucf.from_numpy(a, format="nm(2,4)"), B=b)


@pytest.mark.parametrize("cols_b", [8, 16, 24])
def test_two_of_four_narrow_tiles(monkeypatch, asan_cc, tmp_path, cols_b):  # noqa: F811
    """A constant j narrower than a tile of 4 vectors (``bound``): tiles of 12 x 1,
    6 x 2 or 4 x 3 vectors over 29 rows (5 left over) and partial N:M groups, serial
    (the schedule names no parallel loop: its rows are marked independent)."""
    rng = np.random.default_rng(cols_b)
    a = np.zeros((29, 22), np.float32)
    for r in range(29):
        for g in range(0, 22, 4):
            keep = rng.choice(np.arange(g, min(g + 4, 22)), size=min(2, 22 - g), replace=False)
            a[r, keep] = rng.random(len(keep)) + 0.5
    b = rng.random((22, cols_b)).astype(np.float32)
    k = ucf.compile(
        SPMM,
        formats={"A": "nm(2,4)"},
        target="c",
        dtype="float32",
        schedule=f"bound(j, jb, {cols_b}, MaxExact)",
    )
    _check(monkeypatch, asan_cc, tmp_path, k, a @ b, A=ucf.from_numpy(a, format="nm(2,4)"), B=b)
    assert "row groups" in k.cin


def test_two_of_four_narrower_tiles(monkeypatch, asan_cc, tmp_path):  # noqa: F811
    """float32 by 47 columns, 15 past the last whole tile: narrower tiles of 1 vector,
    then of 4, 2 and 1 lanes (``row_groups.tiled``), over 29 rows that leave a
    different number out of each tile's groups."""
    dtype, cols_b = "float32", 47
    rng = np.random.default_rng(cols_b)
    a = np.zeros((29, 22), dtype)
    for r in range(29):
        for g in range(0, 22, 4):
            keep = rng.choice(np.arange(g, min(g + 4, 22)), size=min(2, 22 - g), replace=False)
            a[r, keep] = rng.random(len(keep)) + 0.5
    b = rng.random((22, cols_b)).astype(dtype)
    k = ucf.compile(
        SPMM,
        formats={"A": "nm(2,4)"},
        target="c",
        dtype=dtype,
        schedule=f"bound(j, jb, {cols_b}, MaxExact)",
    )
    _check(monkeypatch, asan_cc, tmp_path, k, a @ b, A=ucf.from_numpy(a, format="nm(2,4)"), B=b)
    assert "the 15 columns after the whole tiles in narrower tiles" in k.cin


def test_half_values_widened_as_loaded(monkeypatch, asan_cc, tmp_path):  # noqa: F811
    rng = np.random.default_rng(5)
    a = _block_sparse(rng, (12, 10), (4, 2), 0.5, np.float16)
    x = rng.random(10).astype(np.float32)
    k = ucf.compile(SPMV, formats={"A": "bcsr(4,2)@float16"}, target="c", dtype="float32")
    t = ucf.from_numpy(a, format="bcsr(4,2)@float16")
    _check(monkeypatch, asan_cc, tmp_path, k, a.astype(np.float32) @ x, A=t, x=x)


# A tensor read under two index lists beside a blocked operand (issue 32): each read
# gets its own view of the split, so the kernel reads each view inside its own arrays.
# With one view for both reads, D(j,i) walked D's (i, j) split with j's blocks of 3
# where i's were 2: a heap-buffer-overflow read.
VIEWS = [
    ("y(i) = A(i,j) * x(j) + x(i)", "bcsr(2,3)", None),
    ("s = A(i,j) * x(i) * x(j)", "bcsr(3,1)", None),
    ("C(i,j) = A(i,j) + D(i,j) * D(j,i)", "bcsr(2,3)", None),
    ("C(i,j) = A(i,j) + D(i,j) * D(j,i)", "bcsr(2,3)", "csr"),
    ("C(i,k) = A(i,j) * A(j,k)", "nm(2,4)", None),
    ("y(i) = A(i,i) * x(i) + A(i,j) * x(j)", "bcsr(2,3)", None),
    # a diagonal searched in compressed rows, and in a copy of coo converted to be
    ("y(i) = A(i,i) * x(i) + A(i,j) * x(j)", "csr", None),
    ("y(i) = A(i,i) * x(i) + A(i,j) * x(j)", "coo", None),
]


@pytest.mark.parametrize(("expr", "fmt", "dfmt"), VIEWS)
def test_a_tensor_read_twice_beside_blocks(monkeypatch, asan_cc, tmp_path, expr, fmt, dfmt):  # noqa: F811
    rng = np.random.default_rng(32)
    n = 8 if fmt.startswith("nm") else 7  # 7: partial blocks of 2 and of 3
    if fmt.startswith("nm"):
        a = np.zeros((n, n), np.float32)
        for r in range(n):
            for g in range(0, n, 4):
                a[r, g + rng.choice(4, size=2, replace=False)] = rng.random(2) + 0.5
    else:
        a = ((rng.random((n, n)) < 0.5) * (rng.random((n, n)) + 0.5)).astype(np.float32)
    x = rng.random(n).astype(np.float32)
    d = ((rng.random((n, n)) < 0.6) * (rng.random((n, n)) + 0.5)).astype(np.float32)
    ops = {"A": ucf.from_numpy(a, format=fmt)}
    expected = {
        "y(i) = A(i,j) * x(j) + x(i)": lambda: a @ x + x,
        "s = A(i,j) * x(i) * x(j)": lambda: x @ a @ x,
        "C(i,j) = A(i,j) + D(i,j) * D(j,i)": lambda: a + d * d.T,
        "C(i,k) = A(i,j) * A(j,k)": lambda: a @ a,
        "y(i) = A(i,i) * x(i) + A(i,j) * x(j)": lambda: np.diag(a) * x + a @ x,
    }[expr]()
    if "x(" in expr:
        ops["x"] = x
    if "D(" in expr:
        ops["D"] = ucf.from_numpy(d, format=dfmt) if dfmt else d
    formats = {"A": fmt, **({"D": dfmt} if dfmt else {})}
    k = ucf.compile(expr, formats=formats, target="c", dtype="float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ucf.ConversionWarning)  # re-packed views
        extents, slots, output, result = _recorded(monkeypatch, k, **ops)
    shape = np.shape(expected)
    # under ASan first: the over-read is what this test is for, before any wrong answer
    under = run_under_asan(asan_cc, tmp_path, k, "dense", output.shape, extents, slots)
    np.testing.assert_allclose(under.vals, np.asarray(output.vals), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(result).reshape(shape), expected, rtol=1e-5)
