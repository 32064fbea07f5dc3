"""Products of 8-bit integers summed two reduction steps per multiply (``ucf.lower.pairs``,
``ir.PairDot``) against numpy's integer product, exact, on the llvm and c targets:
partial blocks in both modes, blocks of odd width (the last pair misses its second
step), columns that leave a remainder, int8 and uint8 on either side (the low half of
a word is sign- or zero-extended alike), one group of rows and several, blocks stored
by rows and by columns, serial and in threads; the machine code uses pmaddwd; without
AVX2 the widening tiles, and a C kernel built for a CPU without it, give the same
sums."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TARGETS, needs_cc

import ucf
from ucf.ir import nodes as ir
from ucf.ir.walk import nodes
from ucf.lower import pairs

SPMM = "C(i,j) = A(i,k) * B(k,j)"
needs_avx2 = pytest.mark.skipif(not pairs.available(), reason="pairs are made on AVX2 hosts")


def operands(rng, shape, n, block, a_type, b_type):
    """A's values in about half of its blocks and B's, over their types' whole ranges
    (each range's ends included), A zero outside the kept blocks."""
    rows, cols = -(-shape[0] // block[0]), -(-shape[1] // block[1])
    keep = np.kron(rng.random((rows, cols)) < 0.5, np.ones(block, dtype=bool))
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
@pytest.mark.parametrize("target", TARGETS)
def test_the_machine_code_multiplies_pairs(target):
    a, b = operands(np.random.default_rng(22), (32, 32), 48, (32, 32), "int8", "uint8")
    k = run("bcsr(32,32)", a, b, target)
    assert "vpmaddwd" in k.asm


def test_without_avx2_the_tiles_widen_each_byte(monkeypatch, target):
    """On a host without AVX2 pmaddwd is two instructions or more: no pairs (the kernel
    cache keys on it), the same sums."""
    monkeypatch.setattr(pairs, "available", lambda: False)
    a, b = operands(np.random.default_rng(23), (24, 19), 35, (8, 8), "int8", "uint8")
    k = run("bcsr(8,8)", a, b, target)
    assert not paired(k)
    assert "registers: C is accumulated" in k.cin


@needs_avx2
@needs_cc
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
