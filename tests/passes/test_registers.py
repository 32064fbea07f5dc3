"""Register-blocked micro-kernels (``ucf.passes.registers``) against numpy, on the llvm
and c targets: tiles of several rows (a block's places) and of one row (CSR, dense),
extents of ``j`` that leave a remainder or fill no tile at all, partial blocks, int8
values into int32, factors that are broadcast, the other factor's rows packed into a
panel when enough groups of rows share them, and nests the pass must leave alone; and
the numeric contract (``ucf.passes.fma``): every accumulated product one fused
multiply-add, bit for bit alike with and without the micro-kernels, on every target."""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np
import pytest
from llvmlite import binding as llvm

import ucf
from tests.helpers import TARGETS, needs_cc, rand_dense
from ucf.ir import nodes as ir
from ucf.ir.walk import nodes
from ucf.passes import pairs, registers, tiling
from ucf.schedule import cpu_model

SPMM = "C(i,j) = A(i,k) * B(k,j)"


def blocked(rng, shape, block, dtype=np.float64):
    """Integer-valued (exact) entries in about half of the blocks of ``block``."""
    rows, cols = -(-shape[0] // block[0]), -(-shape[1] // block[1])
    keep = np.kron(rng.random((rows, cols)) < 0.5, np.ones(block))[: shape[0], : shape[1]]
    return (keep * rand_dense(rng, shape)).astype(dtype)


def block_shape(fmt: str) -> tuple[int, int]:
    """The block of a ``bcsr(a,b)`` or ``bcsc(a,b)`` format, values suffix or not."""
    rows, cols = fmt[5:].split(")")[0].split(",")
    return int(rows), int(cols)


def vectors(k) -> set[str]:
    """The vector types of the kernel's loads (empty: the pass left it alone)."""
    return {n.type for n in nodes(k.llir) if isinstance(n, ir.VLoad)}


# (format of A, shape of A, columns of B and C, dtype, blocked): tiles of 4 rows x 2
# vectors with a remainder and partial blocks; of 2 rows x 3 vectors (f64: 4 lanes);
# a block of 3 rows (no row tiles: one row per tile, over k_in); fewer columns than
# one tile; CSR A, whose reduction loop is not a block's and stays as it was; dense A,
# which the default blocks as a GEMM (ucf.schedule.dense_products), into tiles.
CASES = [
    ("bcsr(4,4)", (13, 11), 53, np.float32, True),
    ("bcsr(2,3)", (9, 10), 29, np.float64, True),
    ("bcsr(3,2)", (7, 6), 37, np.float32, True),
    ("bcsr(4,4)", (8, 8), 7, np.float32, True),
    ("csr", (9, 14), 70, np.float32, False),
    ("dense", (5, 7), 40, np.float64, True),
]
IDS = [f"{f}-{s[0]}x{s[1]}x{n}-{np.dtype(d).name}" for f, s, n, d, _ in CASES]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt, shape, n, dtype, tiled", CASES, ids=IDS)
def test_spmm_against_numpy(target, fmt, shape, n, dtype, tiled):
    rng = np.random.default_rng(14)
    block = (4, 4) if fmt.startswith("bcsr") else (1, 1)
    a = blocked(rng, shape, block, dtype)
    b = rand_dense(rng, (shape[1], n)).astype(dtype)
    k = ucf.compile(SPMM, formats={"A": fmt}, dtype=np.dtype(dtype).name, target=target)
    got = k(A=ucf.from_numpy(a, format=fmt), B=b).to_numpy()
    np.testing.assert_array_equal(got, a @ b)  # small integers: exact in every order
    elem = ir.NUMPY_TO_IR[np.dtype(dtype).name]
    lanes = tiling.tile_bytes(elem) // np.dtype(dtype).itemsize
    want = {f"{elem}x{lanes}"} if tiled else set()
    assert vectors(k) == want
    assert ("registers: C is accumulated" in k.cin) == tiled


@needs_cc
def test_both_targets_round_alike():
    """Each output element sums its terms in the loop nest's order on both targets, so
    random floats (which round) agree bit for bit."""
    rng = np.random.default_rng(3)
    a = blocked(rng, (32, 32), (8, 8), np.float32) * rng.random((32, 32), dtype=np.float32)
    b = rng.random((32, 45), dtype=np.float32)
    got = [
        ucf.compile(SPMM, formats={"A": "bcsr(8,8)"}, dtype="float32", target=t)(
            A=ucf.from_numpy(a, format="bcsr(8,8)"), B=b
        ).to_numpy()
        for t in ("llvm", "c")
    ]
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_allclose(got[0], a @ b, rtol=1e-5, atol=1e-4)


#: The panels of a parallel loop: the team's cache, allocated before it, then each
#: thread's own (``ucf.passes.panels``).
TEAM_CACHE = ["B_panel_team0", "panel_tags_team0", "B_panel1", "panel_tags1"]


def panels(k) -> set[str]:
    """The names of the kernel's packed panels (a parallel loop's threads write the
    team's or their own, as each picks)."""
    written = {n.array.name for n in nodes(k.llir) if isinstance(n, ir.Store)}
    for n in nodes(k.llir):
        if isinstance(n, ir.Pick) and n.array.name in written:
            written |= {n.first.name, n.second.name}
    return {n.array.name for n in nodes(k.llir) if isinstance(n, ir.Alloc)} & written


# A block's rows of B are the same wherever its block column comes, so the float cases
# pack them once per call and thread (in a parallel loop, team) into a cache of panels
# (``ucf.passes.panels``), with any number of groups of rows; the 8-bit ones B's words.
# (format of A, shape of A, columns of B and C, dtype of the values, of B, of C, whether
# a schedule keeps the loops serial): partial blocks in both modes with a remainder of
# j, in a parallel loop (the panel is each thread's) and in a serial one (the
# function's); f64 (4 lanes); int8 times uint8 (bytes are packed in pairs of steps by
# ucf.passes.pairs on an AVX2 host, in quads on a VNNI one, and not as they are); B rows of 4 KB
# and more (as in the benchmark) and short ones; fewer columns than a tile.
PACKED = [
    ("bcsr(16,16)", (45, 37), 389, "float32", "float32", "float32", False),
    ("bcsr(16,8)", (45, 37), 389, "float32", "float32", "float32", True),
    ("bcsr(16,8)", (40, 19), 197, "float64", "float64", "float64", False),
    ("bcsr(16,16)@int8", (130, 32), 1541, "int8", "uint8", "int32", False),
    ("bcsr(16,16)", (45, 37), 53, "float32", "float32", "float32", False),
    ("bcsr(16,16)", (32, 32), 9, "float32", "float32", "float32", False),
    ("bcsr(64,16)", (130, 37), 389, "float32", "float32", "float32", False),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt, shape, n, a_type, b_type, c_type, serial", PACKED)
def test_packed_panels_against_numpy(
    target, fmt, shape, n, a_type, b_type, c_type, serial, monkeypatch
):
    # the default plan compiled before any call (parallel over i_blk), not the model's
    # plan for this call's two or three block rows
    monkeypatch.setattr(cpu_model, "REPLAN_WORK", 1 << 40)
    rng = np.random.default_rng(15)
    pattern = blocked(rng, shape, (block_shape(fmt)[0], 16)) != 0
    a = np.where(pattern, rng.integers(-100, 100, shape), 0).astype(a_type)
    b = rng.integers(0, 200, (shape[1], n)).astype(b_type)
    formats = {"A": fmt, "B": f"dense@{b_type}"} if b_type == "uint8" else {"A": fmt}
    schedule = "reorder(i_blk,k_blk,i_in,k_in,j)" if serial else None
    k = ucf.compile(SPMM, formats=formats, schedule=schedule, dtype=c_type, target=target)
    got = k(A=ucf.from_numpy(a, format=fmt), B=b).to_numpy()
    np.testing.assert_array_equal(got, a.astype(np.int64) @ b.astype(np.int64))
    loop = next(s for s in k.llir[-1].body if isinstance(s, ir.For))
    assert (loop.parallel is None) == serial
    packed = b_type != "uint8"
    kind = "quads" if pairs.VPDPBUSD in pairs.available() else "pairs"
    cached = ["B_panel0", "panel_tags0"]
    if not serial:  # the team's cache, allocated before the loop, then each thread's own
        cached = TEAM_CACHE
    # B's words likewise (A's are each thread's)
    words = [f"A_{kind}0", f"B_{kind}0", "quads_tags0"]
    if not serial:
        words = [f"B_{kind}_team0", "quads_tags_team0", f"A_{kind}0", f"B_{kind}1", "quads_tags1"]
    want = cached if packed else words if b_type == "uint8" and pairs.available() else []
    assert panels(k) == set(want)
    note = f"B_vals into B_panel0 packed once per call and {'thread' if serial else 'team'}"
    assert (note in k.cin) == packed
    held = [s.array.name for s in [*k.llir[-1].body, *loop.prologue] if isinstance(s, ir.Alloc)]
    assert held == want


@needs_cc
@pytest.mark.parametrize("rows", [16, 64])
def test_packed_panels_round_alike_on_both_targets(rows, monkeypatch):
    """Random floats through the cache of packed panels: llvm and c agree bit for
    bit, and with the plain nest without register blocking (each element sums in the
    same order)."""
    monkeypatch.setattr(cpu_model, "REPLAN_WORK", 1 << 40)  # the plan parallel over i_blk
    rng = np.random.default_rng(4)
    a = blocked(rng, (128, 48), (rows, 16), np.float32) * rng.random((128, 48), np.float32)
    b = rng.random((48, 390), dtype=np.float32)
    fmt = f"bcsr({rows},16)"
    t = ucf.from_numpy(a, format=fmt)

    def run(target: str):
        k = ucf.compile(SPMM, formats={"A": fmt}, dtype="float32", target=target)
        return k(A=t, B=b).to_numpy(), k

    (llvm, k), (c, _) = run("llvm"), run("c")
    assert panels(k) == set(TEAM_CACHE)  # the loop over block rows is parallel
    np.testing.assert_array_equal(llvm, c)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("UCF_REGISTER_BLOCKING", "0")
        plain, k = run("llvm")
    assert not panels(k)
    np.testing.assert_array_equal(llvm, plain)
    np.testing.assert_allclose(llvm, a @ b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_int8_weights_times_uint8_into_int32(target):
    rng = np.random.default_rng(8)
    pattern = blocked(rng, (12, 16), (4, 4)) != 0
    a = np.where(pattern, rng.integers(-127, 128, pattern.shape), 0).astype(np.int8)
    b = rng.integers(0, 256, (16, 35)).astype(np.uint8)
    fmt = "bcsr(4,4)@int8"
    k = ucf.compile(SPMM, formats={"A": fmt, "B": "dense@uint8"}, dtype="int32", target=target)
    got = k(A=ucf.from_numpy(a, format=fmt), B=b).to_numpy()
    np.testing.assert_array_equal(got, a.astype(np.int64) @ b.astype(np.int64))
    lanes = pairs.quad_bytes() // 4  # 16 in the quads of an AVX-512 VNNI host
    assert vectors(k) == {f"u8x{lanes}", f"i32x{lanes}"}


# Statements whose j-varying factors are loads at unit stride (two of them, a
# difference, a negation) and whose other factors are broadcast (d(i)).
STATEMENTS = [
    ("C(i,j) = A(i,k) * (B(k,j) - D(k,j))", lambda a, b, d, v: a @ (b - d)),
    ("C(i,j) = -(A(i,k) * B(k,j)) * v(i)", lambda a, b, d, v: -(a @ b) * v[:, None]),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("expr, reference", STATEMENTS, ids=["difference", "broadcast"])
def test_factors_of_other_shapes(target, expr, reference):
    rng = np.random.default_rng(5)
    a = blocked(rng, (10, 12), (2, 2))
    b, d = rand_dense(rng, (12, 19)), rand_dense(rng, (12, 19))
    v = rand_dense(rng, (10,))
    k = ucf.compile(expr, formats={"A": "bcsr(2,2)"}, target=target)
    ops = {"A": ucf.from_numpy(a, format="bcsr(2,2)"), "B": b, "D": d, "v": v}
    got = k(**{n: t for n, t in ops.items() if n in expr}).to_numpy()
    np.testing.assert_array_equal(got, reference(a, b, d, v))
    assert vectors(k)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", ["relu", "max", "min"])
def test_a_factor_under_max_or_min_is_tiled(target, fn, monkeypatch):
    """relu(B), max(B, D) and min(B, D) vary with j and are tiled, lane by lane as the
    plain nest computes them: a NaN lane picks the second operand (relu(NaN) is 0), and
    the result equals the unblocked kernel's bit for bit."""
    rng = np.random.default_rng(10)
    a = rand_dense(rng, (12, 8))  # every block stored: a NaN reaches every row, as in numpy
    b, d = rand_dense(rng, (8, 43)), rand_dense(rng, (8, 43))
    b[1, 5] = d[2, 9] = np.nan
    expr = {"relu": "relu(B(k,j))", "max": "max(B(k,j), D(k,j))", "min": "min(B(k,j), D(k,j))"}
    stmt = f"C(i,j) = A(i,k) * {expr[fn]}"
    # a comparison with NaN is false, so np.where picks the second operand there
    picked = {
        "relu": np.where(b > 0, b, 0),
        "max": np.where(b > d, b, d),
        "min": np.where(b < d, b, d),
    }
    ops = {"A": ucf.from_numpy(a, format="bcsr(4,4)"), "B": b, "D": d}
    ops = {n: t for n, t in ops.items() if f"{n}(" in stmt}
    k = ucf.compile(stmt, formats={"A": "bcsr(4,4)"}, target=target)
    got = k(**ops).to_numpy()
    np.testing.assert_array_equal(got, a @ picked[fn])
    assert vectors(k) == {f"f64x{tiling.tile_bytes('f64') // 8}"}
    monkeypatch.setenv("UCF_REGISTER_BLOCKING", "0")
    plain = ucf.compile(stmt, formats={"A": "bcsr(4,4)"}, target=target)
    assert not vectors(plain)
    np.testing.assert_array_equal(plain(**ops).to_numpy(), got)


@pytest.mark.parametrize("target", TARGETS)
def test_a_row_summed_over_is_one_tile(target):
    """y(j) sums over the block's rows too: they share one tile of y, so the rows are
    not blocked (their tiles would be the same registers), only the k_in loop."""
    rng = np.random.default_rng(6)
    a = blocked(rng, (8, 8), (4, 4))
    b = rand_dense(rng, (8, 40))
    k = ucf.compile("y(j) = A(i,k) * B(k,j)", formats={"A": "bcsr(4,4)"}, target=target)
    got = k(A=ucf.from_numpy(a, format="bcsr(4,4)"), B=b).to_numpy()
    np.testing.assert_array_equal(got, a.sum(axis=0) @ b)
    assert vectors(k) == {f"f64x{tiling.tile_bytes('f64') // 8}"}


@pytest.mark.parametrize("target", TARGETS)
def test_a_strided_factor_is_left_alone(target):
    """B(j,k) in row-major storage varies with j at the stride of a row: no vectors."""
    rng = np.random.default_rng(7)
    a, b = blocked(rng, (8, 8), (4, 4)), rand_dense(rng, (40, 8))
    k = ucf.compile("C(i,j) = A(i,k) * B(j,k)", formats={"A": "bcsr(4,4)"}, target=target)
    got = k(A=ucf.from_numpy(a, format="bcsr(4,4)"), B=b).to_numpy()
    np.testing.assert_array_equal(got, a @ b.T)
    assert not vectors(k)


def test_the_environment_turns_it_off(monkeypatch):
    """UCF_REGISTER_BLOCKING=0 plans the plain nest (cached apart: the kernel cache
    keys on it); the answer is the same; a value other than 0 or 1 is refused."""
    rng = np.random.default_rng(9)
    a, b = blocked(rng, (8, 8), (4, 4)), rand_dense(rng, (8, 40))
    t = ucf.from_numpy(a, format="bcsr(4,4)")
    monkeypatch.setenv("UCF_REGISTER_BLOCKING", "0")
    k = ucf.compile(SPMM, formats={"A": "bcsr(4,4)"})
    np.testing.assert_array_equal(k(A=t, B=b).to_numpy(), a @ b)
    assert not vectors(k)
    monkeypatch.setenv("UCF_REGISTER_BLOCKING", "yes")
    with pytest.raises(ucf.UcfError, match="UCF_REGISTER_BLOCKING"):
        ucf.compile(SPMM, formats={"A": "bcsr(4,4)"})(A=t, B=b)


@pytest.mark.parametrize("fmt, times", [("bcsr(32,32)", registers.TILE_WORK), ("csr", 1)])
def test_tiles_raise_the_parallel_work_threshold(monkeypatch, fmt, times):
    """A parallel loop around tiles starts its threads at TILE_WORK times the threshold's
    work (a tile's multiply-adds are that much cheaper); other loops at the threshold."""
    monkeypatch.setenv("UCF_WORK_THRESHOLD", "1000")
    rng = np.random.default_rng(2)
    a, b = blocked(rng, (256, 64), (32, 32), np.float32), rand_dense(rng, (64, 48))
    k = ucf.compile(SPMM, formats={"A": fmt}, dtype="float32")
    got = k(A=ucf.from_numpy(a, format=fmt), B=b.astype(np.float32)).to_numpy()
    np.testing.assert_array_equal(got, a @ b.astype(np.float32))
    loop = next(s for s in k.llir[-1].body if isinstance(s, ir.For))
    assert loop.parallel == "CPUThread"
    assert loop.parallel_if.right == ir.Const(1000 * times, ir.I64)


# X(t,d) * W(d,h) with W blocked and the blocks outside the rows of X: the loop over t,
# whose trip count comes with the call, is cut into tiles of 4 rows and its last rows run
# untiled (t = 1, 3, 6, 13: no whole tile, a remainder of 3, 2 and 1).
ROW_TILES = [
    ("bcsr(4,4)", "reorder(d_blk,h_blk,t,d_in,h_in)"),
    ("bcsc(4,4)", "reorder(h_blk,d_blk,t,d_in,h_in)"),
    ("bcsc(4,8)", "reorder(h_blk,d_blk,t,d_in,h_in); parallelize(h_blk,CPUThread,NoRaces)"),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt, schedule", ROW_TILES, ids=[f for f, _ in ROW_TILES])
def test_rows_known_at_the_call_are_tiled(target, fmt, schedule, monkeypatch):
    monkeypatch.setenv("UCF_WORK_THRESHOLD", "0")  # the parallel case starts its threads
    rng = np.random.default_rng(9)
    w = blocked(rng, (10, 37), block_shape(fmt), np.float32)
    stored = ucf.from_numpy(w, format=fmt)
    k, plus = (
        ucf.compile(
            f"T(t,h) {op} X(t,d) * W(d,h)",
            formats={"W": fmt},
            schedule=schedule,
            target=target,
            dtype="float32",
        )
        for op in ("=", "+=")
    )
    assert "tiles of 4 rows (t)" in k.cin
    for rows in (1, 3, 6, 13):
        x = rand_dense(rng, (rows, 10)).astype(np.float32)
        np.testing.assert_array_equal(k(X=x, W=stored).to_numpy(), x @ w)
    x, t0 = rand_dense(rng, (7, 10)).astype(np.float32), rand_dense(rng, (7, 37))
    out = t0.astype(np.float32)
    plus(X=x, W=stored, out=out)
    np.testing.assert_array_equal(out, t0.astype(np.float32) + x @ w)


def eighths_in_blocks(rng, shape, block):
    """Multiples of 1/8 in about half of the blocks, each kept block holding 127/8 (a
    symmetric qint8 scale of exactly 1/8 per block, so quantizing changes nothing)."""
    w = blocked(rng, shape, block, np.float32) / 8
    for r in range(0, shape[0], block[0]):
        for c in range(0, shape[1], block[1]):
            if w[r : r + block[0], c : c + block[1]].any():
                w[r, c] = 127 / 8
    return w


# X(t,d) * W(d,h) with W's blocks quantized, a scale per block: the dequantized block,
# (q - zero) * scale, is what every group of rows of X reads alike, so it is computed once
# per block into a panel instead of once per group of 4 rows. The rows come with the call
# (3: no whole group, so no panel is filled; 13: 3 groups and a remainder; 21), blocks by
# column and by row, partial blocks of d, a parallel loop (a panel per thread), and
# float32 blocks (the load itself packed).
QUANTIZED = [
    ("bcsc(8,16)@qint8:1", "reorder(h_blk,d_blk,t,d_in,h_in)"),
    ("bcsr(8,16)@qint8:1", "reorder(d_blk,h_blk,t,d_in,h_in)"),
    (
        "bcsc(8,32)@qint8:1",
        "reorder(h_blk,d_blk,t,d_in,h_in); parallelize(h_blk,CPUThread,NoRaces)",
    ),
    ("bcsc(8,16)", "reorder(h_blk,d_blk,t,d_in,h_in)"),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt, schedule", QUANTIZED, ids=[f for f, _ in QUANTIZED])
def test_a_dequantized_block_is_packed_once(target, fmt, schedule, monkeypatch):
    monkeypatch.setenv("UCF_WORK_THRESHOLD", "0")  # the parallel case starts its threads
    rng = np.random.default_rng(12)
    block = block_shape(fmt)
    w = eighths_in_blocks(rng, (21, 4 * block[1]), block)
    stored = ucf.quantize(w, format=fmt) if "@" in fmt else ucf.from_numpy(w, format=fmt)
    np.testing.assert_array_equal(stored.to_numpy(), w)
    k = ucf.compile(
        "T(t,h) = X(t,d) * W(d,h)", {"W": fmt}, schedule, target=target, dtype="float32"
    )
    computed = "(W_vals, W_zero, W_scale)" if "@" in fmt else "W_vals"
    assert f"{computed} into W_panel0 packed before each t loop, for its groups" in k.cin
    assert panels(k) == {"W_panel0"}
    for rows in (3, 13, 21):
        x = rand_dense(rng, (rows, 21)).astype(np.float32)
        np.testing.assert_array_equal(k(X=x, W=stored).to_numpy(), x @ w)


@needs_cc
def test_a_dequantized_panel_rounds_alike_on_both_targets(monkeypatch):
    """Random floats times quantized blocks through the panel: llvm, c and the plain nest
    agree bit for bit (the panel holds what each group computed before)."""
    rng = np.random.default_rng(13)
    fmt, block = "bcsc(8,16)@qint8:1", (8, 16)
    w = blocked(rng, (40, 64), block, np.float32) * rng.random((40, 64), dtype=np.float32)
    stored = ucf.quantize(w, format=fmt)
    x = rng.standard_normal((30, 40)).astype(np.float32)

    def run(target: str) -> np.ndarray:
        k = ucf.compile(
            "T(t,h) = X(t,d) * W(d,h)",
            {"W": fmt},
            "reorder(h_blk,d_blk,t,d_in,h_in)",
            target=target,
            dtype="float32",
        )
        assert bool(panels(k)) == tiling.enabled()
        return k(X=x, W=stored).to_numpy()

    llvm, c = run("llvm"), run("c")
    monkeypatch.setenv("UCF_REGISTER_BLOCKING", "0")
    plain = run("llvm")
    np.testing.assert_array_equal(llvm, c)
    np.testing.assert_array_equal(llvm, plain)
    np.testing.assert_allclose(llvm, x @ stored.to_numpy(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt", ["bcsr(8,16)@qint8:1", "bcsr(4,4)@qint8:1", "bcsr(8,8)@qint8"])
def test_a_quantized_broadcast_factor_is_converted_once_per_group(target, fmt, monkeypatch):
    """A quantized A of ``A(i,k) * B(k,j)`` is the factor each row of a tile broadcasts:
    it is converted once per group of rows into a buffer, not once per tile of j (three
    tiles and a rest here), with results exact against numpy (eighths) and bit for bit
    those of the plain nest on random floats."""
    monkeypatch.setenv("UCF_WORK_THRESHOLD", "0")
    rng = np.random.default_rng(14)
    block = block_shape(fmt)
    a = eighths_in_blocks(rng, (4 * block[0] + 3, 5 * block[1] + 1), block)
    stored = ucf.quantize(a, format=fmt)
    np.testing.assert_array_equal(stored.to_numpy(), a)
    k = ucf.compile("C(i,j) = A(i,k) * B(k,j)", {"A": fmt}, target=target, dtype="float32")
    assert "A_scale) converted once per group" in k.cin, k.cin
    b = rand_dense(rng, (a.shape[1], 53)).astype(np.float32)
    np.testing.assert_array_equal(k(A=stored, B=b).to_numpy(), a @ b)
    noisy = ucf.quantize(a * rng.random(a.shape, dtype=np.float32), format=fmt)
    bf = rng.standard_normal(b.shape).astype(np.float32)
    tiled = k(A=noisy, B=bf).to_numpy()
    monkeypatch.setenv("UCF_REGISTER_BLOCKING", "0")
    plain = ucf.compile("C(i,j) = A(i,k) * B(k,j)", {"A": fmt}, target=target, dtype="float32")
    assert "converted once" not in plain.cin
    np.testing.assert_array_equal(tiled, plain(A=noisy, B=bf).to_numpy())


def fused_products(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` in float64 as ucf's contract sums it (``ucf.passes.fma``): each element's
    terms in the order of k, each added unrounded and the sum rounded once (exact
    rationals, rounded by ``float``, which rounds to nearest)."""
    out = np.zeros((a.shape[0], b.shape[1]))
    for i, j in np.ndindex(out.shape):
        acc = 0.0
        for k in np.flatnonzero(a[i]):
            acc = float(Fraction(acc) + Fraction(a[i, k]) * Fraction(b[k, j]))
        out[i, j] = acc
    return out


# The micro-kernel (bcsr), a packed panel (16 rows: 4 groups), and the generic nests of
# a scalar accumulator (csr) and of an accumulating store (dense, k outside j).
FUSED = [("bcsr(4,4)", None), ("bcsr(16,16)", None), ("csr", None), ("dense", "reorder(i,k,j)")]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt, schedule", FUSED, ids=[f for f, _ in FUSED])
def test_every_accumulated_product_is_one_fused_multiply_add(target, fmt, schedule, monkeypatch):
    """Random floats, whose products round: with and without the micro-kernel, the sums
    are bit for bit the fused ones (and not the unfused ones, which differ here)."""
    rng = np.random.default_rng(21)
    a = blocked(rng, (32, 24), (4, 4)) * rng.standard_normal((32, 24))
    b = rng.standard_normal((24, 19))
    want = fused_products(a, b)
    unfused = np.zeros_like(want)
    for k in range(a.shape[1]):
        unfused += a[:, [k]] * b[[k]]
    assert not np.array_equal(want, unfused)
    for blocking in ("1", "0"):
        monkeypatch.setenv("UCF_REGISTER_BLOCKING", blocking)
        k = ucf.compile(SPMM, formats={"A": fmt}, schedule=schedule, target=target)
        got = k(A=ucf.from_numpy(a, format=fmt), B=b).to_numpy()
        np.testing.assert_array_equal(got, want, err_msg=f"{fmt}, blocking {blocking}")
        products = [n for n in nodes(k.llir) if isinstance(n, ir.Bin) and n.op == "*"]
        assert not [n for n in products if ir.element(n.type) in ir.FLOAT_TYPES]


@pytest.mark.slow
def test_cuda_emulation_fuses_alike():
    """The CUDA printer's ``fma`` (the C printer's), built by the emulator (slow: the
    emulator's header alone takes about 10 s to build in a fresh cache)."""
    rng = np.random.default_rng(22)
    a = blocked(rng, (40, 24), (1, 1)) * rng.standard_normal((40, 24))
    x = rng.standard_normal((24, 1))
    k = ucf.compile("y(i) = A(i,j) * x(j)", formats={"A": "csr"}, target="cuda", emulate=True)
    assert " = fma(" in k.source
    got = k(A=ucf.from_numpy(a, format="csr"), x=x[:, 0]).to_numpy()
    np.testing.assert_array_equal(got, fused_products(a, x)[:, 0])


@needs_cc
@pytest.mark.skipif(not llvm.get_host_cpu_features().get("fma"), reason="host without FMA3")
@pytest.mark.parametrize("target", ["llvm", "c"])
def test_the_tile_multiplies_and_adds_in_one_instruction(target):
    """On an FMA3 host the micro-kernel's vector multiply-adds are ``vfmadd`` (C: the
    ``ucf_fma_f32x8`` macro, or ``ucf_fma_f32x16`` on an AVX-512 host), with no separate
    multiply left in the kernel."""
    k = ucf.compile(SPMM, formats={"A": "bcsr(8,8)"}, dtype="float32", target=target)
    assert "registers: C is accumulated" in k.cin
    lanes = tiling.tile_bytes("f32") // 4
    assert re.search(r"vfmadd\d+ps\s+[^\n]*%" + ("zmm" if lanes == 16 else "ymm"), k.asm)
    assert "vmulps" not in k.asm
    if target == "c":
        assert f"ucf_fma_f32x{lanes}(" in k.c_source


@needs_cc
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_c_target_without_fma3_fuses_lane_by_lane(dtype, monkeypatch):
    """Built for a CPU without FMA3 (a saved kernel's portable build), C's ``fmaf``/
    ``fma`` lane by lane: the same values as the llvm target's ``vfmadd``."""
    rng = np.random.default_rng(23)
    a = (blocked(rng, (16, 12), (4, 4)) * rng.standard_normal((16, 12))).astype(dtype)
    b = rng.standard_normal((12, 37)).astype(dtype)
    t = ucf.from_numpy(a, format="bcsr(4,4)")
    want = ucf.compile(SPMM, formats={"A": "bcsr(4,4)"}, dtype=dtype)(A=t, B=b).to_numpy()
    flags = "-O3 -march=x86-64 -Wall -Werror -ffp-contract=off -fopenmp -fPIC -shared"
    monkeypatch.setenv("UCF_CFLAGS", flags)
    k = ucf.compile(SPMM, formats={"A": "bcsr(4,4)"}, dtype=dtype, target="c")
    assert "vfmadd" not in k.asm
    np.testing.assert_array_equal(k(A=t, B=b).to_numpy(), want)
    if dtype == "float64":
        np.testing.assert_array_equal(want, fused_products(a, b))
