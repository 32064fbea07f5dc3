"""Products of 8-bit integers summed two reduction steps per multiply (``ucf.passes.pairs``,
``ir.PairDot``) against numpy's integer product, exact, on the llvm and c targets:
partial blocks in both modes, blocks of odd width (the last pair misses its second
step), columns that leave a remainder, int8 and uint8 on either side (the low half of
a word is sign- or zero-extended alike), one group of rows and several, blocks stored
by rows and by columns, serial and in threads; the machine code uses pmaddwd; without
AVX2 the widening tiles, and a C kernel built for a CPU without it, give the same
sums.

Four steps per multiply (``ir.QuadDot``, VNNI's vpdpbusd) are made only on a host with
VNNI, which this one may not be: tests force them (``available`` replaced), so the
code generators' exact expansion runs here against numpy, and the instruction is
checked in the assembly of the JIT's IR and of the C kernel for CPUs that have it."""

from __future__ import annotations

import re

import llvmlite.binding as llvm
import numpy as np
import pytest

import ucf
from tests.helpers import TARGETS, needs_cc
from ucf.codegen import llvm as llvm_codegen
from ucf.ir import nodes as ir
from ucf.ir.walk import nodes
from ucf.passes import pairs, panels

SPMM = "C(i,j) = A(i,k) * B(k,j)"
needs_avx2 = pytest.mark.skipif(not pairs.available(), reason="pairs are made on AVX2 hosts")


@pytest.fixture
def pairs_only(monkeypatch):
    """Pairs whatever the host (a VNNI host would take quads for int8 times uint8)."""
    monkeypatch.setattr(pairs, "available", lambda: (pairs.PMADDWD,))


@pytest.fixture
def quads(monkeypatch):
    """Quads made as on a VNNI host, whatever this one is (the kernel cache keys on
    ``available``)."""
    monkeypatch.setattr(pairs, "available", lambda: (pairs.PMADDWD, pairs.VPDPBUSD))


def operands(rng, shape, n, block, a_type, b_type, kept=0.5):
    """A's values in about ``kept`` of its blocks and B's, over their types' whole ranges
    (each range's ends included where kept), A zero outside the kept blocks."""
    rows, cols = -(-shape[0] // block[0]), -(-shape[1] // block[1])
    keep = np.kron(rng.random((rows, cols)) < kept, np.ones(block, dtype=bool))
    a_info, b_info = np.iinfo(a_type), np.iinfo(b_type)
    a = rng.integers(a_info.min, a_info.max + 1, shape).astype(a_type)
    a[0, :2] = a_info.min, a_info.max
    a = np.where(keep[: shape[0], : shape[1]], a, 0).astype(a_type)
    b = rng.integers(b_info.min, b_info.max + 1, (shape[1], n)).astype(b_type)
    b[:2, 0] = b_info.min, b_info.max
    return a, b


def run(fmt, a, b, target, schedule=None):
    formats = {"A": f"{fmt}@{a.dtype}", "B": f"dense@{b.dtype}"}
    k = ucf.compile(SPMM, formats=formats, dtype="int32", target=target, schedule=schedule)
    got = k(A=ucf.from_numpy(a, format=formats["A"]), B=b).to_numpy()
    np.testing.assert_array_equal(got, a.astype(np.int64) @ b.astype(np.int64))
    return k


def paired(k) -> bool:
    return any(isinstance(n, ir.PairDot) for n in nodes(k.llir))


def quadded(k) -> bool:
    return any(isinstance(n, ir.QuadDot) for n in nodes(k.llir))


SERIAL = "reorder(i_blk,k_blk,i_in,k_in,j)"
# (format of A, shape of A, columns of B, type of A, of B, schedule, whether the outer
# loop runs in threads): partial blocks in
# both modes and 45 = 2 tiles of 16 + 13 columns; blocks 3 wide (odd: the last pair is
# half empty) with partial ones; uint8 times int8 in blocks 5 wide, serial; one group of
# 4 rows, int8 times int8, blocks stored by columns (A's pairs are four places apart;
# the default loops over blocks of k outside, serially), fewer columns than a tile.
CASES = [
    ("bcsr(8,8)", (30, 37), 45, "int8", "uint8", None, True),
    ("bcsr(8,3)", (17, 22), 40, "int8", "uint8", None, True),
    ("bcsr(16,5)", (40, 12), 100, "uint8", "int8", SERIAL, False),
    ("bcsc(4,4)", (13, 11), 9, "int8", "int8", None, False),
]
IDS = [f"{f}-{a}x{b}" for f, _, _, a, b, _, _ in CASES]


@needs_avx2
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt, shape, n, a_type, b_type, schedule, threads", CASES, ids=IDS)
@pytest.mark.usefixtures("pairs_only")
def test_pairs_against_numpy(target, fmt, shape, n, a_type, b_type, schedule, threads, monkeypatch):
    monkeypatch.setenv("UCF_WORK_THRESHOLD", "0")  # the parallel loops start their threads
    block = tuple(int(x) for x in fmt[5:-1].split(","))
    a, b = operands(np.random.default_rng(21), shape, n, block, a_type, b_type)
    k = run(fmt, a, b, target, schedule)
    assert paired(k)
    assert "k_in runs in pairs of steps" in k.cin
    loop = next(s for s in k.llir[-1].body if isinstance(s, ir.For))
    assert (loop.parallel == "CPUThread") == threads


@needs_avx2
@pytest.mark.usefixtures("pairs_only")
@pytest.mark.parametrize("target", TARGETS)
def test_the_machine_code_multiplies_pairs(target):
    a, b = operands(np.random.default_rng(22), (32, 32), 48, (32, 32), "int8", "uint8")
    k = run("bcsr(32,32)", a, b, target)
    assert "vpmaddwd" in k.asm


def test_without_avx2_the_tiles_widen_each_byte(monkeypatch, target):
    """On a host without AVX2 pmaddwd is two instructions or more: no pairs (the kernel
    cache keys on it), the same sums."""
    monkeypatch.setattr(pairs, "available", lambda: ())
    a, b = operands(np.random.default_rng(23), (24, 19), 35, (8, 8), "int8", "uint8")
    k = run("bcsr(8,8)", a, b, target)
    assert not paired(k)
    assert "registers: C is accumulated" in k.cin


@needs_avx2
@needs_cc
@pytest.mark.usefixtures("pairs_only")
def test_a_c_kernel_built_without_avx2_sums_alike(monkeypatch):
    """The C kernel's ``ucf_pairdot_i32x8`` falls back to the definition's sums when the
    compiler does not target AVX2 (a saved kernel built for another CPU), without a
    warning: the values of the JIT's pmaddwd, bit for bit."""
    a, b = operands(np.random.default_rng(24), (40, 26), 70, (8, 8), "uint8", "int8")
    jit = run("bcsr(8,8)", a, b, "llvm")
    flags = "-O3 -march=x86-64 -Wall -Werror -ffp-contract=off -fopenmp -fPIC -shared"
    monkeypatch.setenv("UCF_CFLAGS", flags)  # no AVX: not even a warning
    k = run("bcsr(8,8)", a, b, "c")
    assert paired(k) and "_mm256_madd_epi16" in k.source
    assert "vpmaddwd" not in k.asm
    t = ucf.from_numpy(a, format="bcsr(8,8)@uint8")
    np.testing.assert_array_equal(k(A=t, B=b).to_numpy(), jit(A=t, B=b).to_numpy())


# (format of A, shape of A, columns of B, type of A, of B, share of A's blocks kept,
# schedule): partial blocks in both modes (the last block of k has 5 steps, a quad and
# one step), 45 = 2 tiles of 16 + 13 columns, in threads; blocks 3 wide (a quad short of
# its last step), uint8 times int8; blocks 6 wide (a quad and a half) all kept, one tile
# of columns; no block kept (all zero), serial; blocks of 32 (8 whole quads) all kept.
QUADS = [
    ("bcsr(8,8)", (30, 37), 45, "int8", "uint8", 0.5, None),
    ("bcsr(8,3)", (17, 22), 40, "uint8", "int8", 0.5, None),
    ("bcsr(4,6)", (12, 30), 16, "int8", "uint8", 1.0, None),
    ("bcsr(16,5)", (40, 12), 100, "uint8", "int8", 0.0, SERIAL),
    ("bcsr(32,32)", (64, 64), 48, "int8", "uint8", 1.0, None),
]
QUAD_IDS = [f"{f}-{a}x{b}-{kept}" for f, _, _, a, b, kept, _ in QUADS]


@pytest.mark.usefixtures("quads")
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fmt, shape, n, a_type, b_type, kept, schedule", QUADS, ids=QUAD_IDS)
def test_quads_against_numpy(target, fmt, shape, n, a_type, b_type, kept, schedule):
    """Exact on this host whether or not it has VNNI: without it the JIT runs the LLVM
    expansion of ``QuadDot`` and the C kernel its macro's sums."""
    block = tuple(int(x) for x in fmt[5:-1].split(","))
    a, b = operands(np.random.default_rng(31), shape, n, block, a_type, b_type, kept)
    k = run(fmt, a, b, target, schedule)
    assert quadded(k) and not paired(k)
    assert "k_in runs in quads of steps" in k.cin and "(vpdpbusd)" in k.cin


# (format of A, shape of A, columns of B): bcsr(32,32) with 80 = 2 tiles of 32 + 16
# columns; bcsr(16,16) with partial blocks (the last block of k has 8 steps, two quads);
# bcsr(4,8), 4 rows (fewer than a wide tile's 8: tiles of 4); blocks 7 wide (the last
# quad short of a step) with a partial block row. A's second block row is empty in each.
# 9 to 11 block rows: enough for two threads to share them (with fewer, the default
# runs the rows of a block in threads, without tiles of rows).
WIDE = [
    ("bcsr(32,32)", (288, 64), 80),
    ("bcsr(16,16)", (152, 40), 70),
    ("bcsr(4,8)", (40, 30), 35),
    ("bcsr(8,7)", (83, 33), 33),
]


@pytest.mark.usefixtures("quads")
@pytest.mark.parametrize("wide", [True, False], ids=["512bit", "256bit"])
@pytest.mark.parametrize("fmt, shape, n", WIDE, ids=[f for f, *_ in WIDE])
def test_wide_and_narrow_quad_tiles_against_numpy(monkeypatch, target, fmt, shape, n, wide):
    """Quads tiles of 16 int32 lanes (a host with AVX-512 VNNI) and of 8, forced whatever
    this host is: exact against numpy on the llvm and c targets, on 1 and 2 threads.
    Where the host lacks the instruction for the width, the JIT splits or expands it,
    and the C macro too."""
    monkeypatch.setattr(pairs, "_avx512_vnni", lambda: wide)
    monkeypatch.setenv("UCF_WORK_THRESHOLD", "0")  # the parallel loops start their threads
    block = tuple(int(x) for x in fmt[5:-1].split(","))
    a, b = operands(np.random.default_rng(35), shape, n, block, "int8", "uint8", 0.7)
    a[block[0] : 2 * block[0]] = 0
    formats = {"A": f"{fmt}@int8", "B": "dense@uint8"}
    k = ucf.compile(SPMM, formats=formats, dtype="int32", target=target)
    t, want = ucf.from_numpy(a, format=formats["A"]), a.astype(np.int64) @ b.astype(np.int64)
    for threads in (1, 2):
        ucf.set_num_threads(threads)
        np.testing.assert_array_equal(k(A=t, B=b).to_numpy(), want)
        lanes = {ir.lanes(x.type) for x in nodes(k.llir) if isinstance(x, ir.QuadDot)}
        assert lanes == {16 if wide else 8}
        rows = 8 if wide and block[0] % 8 == 0 else 4
        assert f"tiles of {rows} rows (i_in) x {32 if wide else 16} j" in k.cin
        # each thread's cache, or in the parallel plan the team's
        assert re.search(r"once per call and (thread|team \(.*\)) for each k_blk", k.cin)
    # the block rows ran in threads
    assert any(isinstance(x, ir.For) and x.parallel == "CPUThread" for x in nodes(k.llir))


@pytest.mark.usefixtures("quads")
@pytest.mark.parametrize("slots", ["every", "one"])
def test_quads_of_b_packed_once_per_block_column(monkeypatch, tmp_path, target, slots):
    """B's words are packed into a per-thread cache, a slot per block column, and read by
    every block of that column: exact whether every column has its slot or one slot
    serves them all (each block then packs its column again, the tag telling)."""
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))  # CACHE_BYTES is not in the key
    if slots == "one":
        monkeypatch.setattr(panels, "CACHE_BYTES", 1)
    a, b = operands(np.random.default_rng(36), (48, 45), 40, (8, 9), "int8", "uint8", 0.6)
    k = run("bcsr(8,9)", a, b, target, SERIAL)
    assert "B_quads0 once per call and thread for each k_blk" in k.cin


@pytest.mark.usefixtures("quads")
@pytest.mark.parametrize("a_type, b_type", [("int8", "int8"), ("uint8", "uint8")])
def test_other_signs_keep_pairs(a_type, b_type):
    """vpdpbusd multiplies an unsigned byte by a signed one: two signed or two unsigned
    bytes take pmaddwd's pairs even where quads are made."""
    a, b = operands(np.random.default_rng(32), (16, 13), 20, (8, 8), a_type, b_type)
    k = run("bcsr(8,8)", a, b, "llvm")
    assert paired(k) and not quadded(k)


def optimized_assembly(text: str, cpu: str) -> str:
    """The assembly LLVM emits for the IR ``text`` on ``cpu``, after the O3 pipeline the
    JIT runs."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    machine = llvm.Target.from_default_triple().create_target_machine(cpu=cpu, opt=3)
    mod = llvm.parse_assembly(text)
    mod.verify()
    builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(3))
    builder.getModulePassManager().run(mod, builder)
    return machine.emit_assembly(mod)


# A CPU with AVX-512 VNNI, and ones with only AVX-VNNI (vpdpbusd's VEX form), with the
# features that decide the code generators' choice.
VNNI_CPUS = [
    ("icelake-server", "+avx2,+avx512vl,+avx512vnni", "\tvpdpbusd\t"),
    ("alderlake", "+avx2,+avxvnni", "{vex}\tvpdpbusd\t"),
    ("sierraforest", "+avx2,+avxvnni", "{vex}\tvpdpbusd\t"),
]


@pytest.mark.usefixtures("quads")
@pytest.mark.parametrize("cpu, features, instruction", VNNI_CPUS, ids=[c for c, *_ in VNNI_CPUS])
def test_the_jit_uses_vpdpbusd_on_a_vnni_cpu(cpu, features, instruction):
    """The JIT's IR for a VNNI CPU calls the intrinsic, which LLVM compiles to vpdpbusd
    (LLVM 22 does not form it from the expansion); ``k.asm`` is the host's code, which
    has it exactly when the host has VNNI."""
    a, b = operands(np.random.default_rng(33), (32, 32), 48, (32, 32), "int8", "uint8")
    k = run("bcsr(32,32)", a, b, "llvm")
    text = llvm_codegen.module(k.llir, features=features)
    # the tile is as wide as this host's (pairs.quad_bytes): a 512-bit one is two halves
    # on a CPU with only the 256-bit form
    wide = pairs.quad_bytes() == 64 and pairs.vnni512(features)
    assert f"llvm.x86.avx512.vpdpbusd.{512 if wide else 256}" in text
    assert instruction in optimized_assembly(text, cpu)
    host = pairs.vnni(pairs.host_features())
    assert ("llvm.x86.avx512.vpdpbusd." in k.source) == host
    assert ("vpdpbusd" in k.asm) == host


@needs_cc
@pytest.mark.usefixtures("quads")
@pytest.mark.parametrize(
    "march, instruction",
    [("icelake-server", "\tvpdpbusd\t"), ("alderlake", "{vex} vpdpbusd")],
)
def test_the_c_kernel_uses_vpdpbusd_on_a_vnni_cpu(monkeypatch, march, instruction):
    """The saved C kernel built for a VNNI CPU: its macro is the intrinsic, vpdpbusd in
    the assembly (read, not run: this host may not have it)."""
    flags = f"-O3 -march={march} -Wall -Werror -ffp-contract=off -fopenmp -fPIC -shared"
    monkeypatch.setenv("UCF_CFLAGS", flags)
    formats = {"A": "bcsr(32,32)@uint8", "B": "dense@int8"}
    k = ucf.compile(SPMM, formats=formats, dtype="int32", target="c", schedule=SERIAL)
    assert quadded(k)
    assert instruction in k.asm


@needs_cc
@pytest.mark.skipif(
    "+avxvnni" not in pairs.host_features().split(","), reason="runs AVX-VNNI's vpdpbusd"
)
@pytest.mark.usefixtures("quads")
def test_a_wide_c_tile_in_avx_vnni_halves(monkeypatch):
    """The 16-lane quads tile built for a CPU with AVX-VNNI but not AVX-512 VNNI (this
    host without its AVX-512 VNNI): the C macro runs ``_mm256_dpbusd_avx_epi32`` on each
    half, exactly."""
    monkeypatch.setattr(pairs, "_avx512_vnni", lambda: True)
    flags = "-O3 -march=native -mno-avx512vnni -Wall -Werror -ffp-contract=off -fopenmp -fPIC"
    monkeypatch.setenv("UCF_CFLAGS", flags + " -shared")
    a, b = operands(np.random.default_rng(37), (40, 45), 70, (8, 9), "int8", "uint8")
    k = run("bcsr(8,9)", a, b, "c")
    assert "ucf_quaddot_i32x16" in k.source and "{vex} vpdpbusd" in k.asm


@needs_cc
@pytest.mark.usefixtures("quads")
def test_a_c_kernel_built_without_vnni_sums_alike(monkeypatch):
    """Built for an AVX2 CPU without VNNI (a saved kernel on such a host), the C macro's
    sums give numpy's products, without a warning."""
    flags = "-O3 -march=haswell -Wall -Werror -ffp-contract=off -fopenmp -fPIC -shared"
    monkeypatch.setenv("UCF_CFLAGS", flags)
    a, b = operands(np.random.default_rng(34), (24, 21), 35, (8, 8), "int8", "uint8")
    k = run("bcsr(8,8)", a, b, "c")
    assert quadded(k) and f"ucf_quaddot_i32x{pairs.quad_bytes() // 4}" in k.source
    assert "vpdpbusd" not in k.asm
