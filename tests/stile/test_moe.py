"""MoE's gathered-rows kernel (``ucf.stile.kernels.rows_function``) where its output
is a used array: a recycled new C (``ucf.exec.recycled``) or out=, whose rows no token
is routed to the kernel zeroes itself; and its register tiles of 6 rows with every
remainder of rows past the last whole group."""

from __future__ import annotations

import numpy as np
import pytest

import ucf
from ucf.exec import recycled

MOE = "C(e,t,n) = R(e,t) * X(t,d) * W(e,d,n)"


def _reference(r, x, w):
    return np.einsum("et,td,edn->etn", r, x, w)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_a_new_output_recycles_a_dropped_one_and_zeroes_its_old_rows(target):
    """A C of 4 MB or more comes back for the next call once dropped, holding the old
    values: the kernel zeroes the rows this routing leaves out (expert 0 had every token,
    now none). A C still held is not reused, and keeps its values."""
    rng = np.random.default_rng(20)
    e, t, d, n = 4, 1031, 16, 256  # 4.2 MB of float32
    assert e * t * n * 4 >= recycled.MIN_BYTES
    x = rng.standard_normal((t, d)).astype(np.float32)
    w = rng.standard_normal((e, d, n)).astype(np.float32)
    kern = ucf.compile(MOE, dynamic={"R": (1, 1)}, dtype=np.float32, target=target)
    first = np.zeros((e, t), np.float32)
    first[0], first[2, ::3] = rng.random(t), rng.random(len(range(0, t, 3)))
    second = np.zeros((e, t), np.float32)
    second[1, ::2], second[3, 5:9] = 1.0, rng.random(4)

    nbytes = e * t * n * 4
    got = np.asarray(kern(R=first, X=x, W=w))
    assert np.allclose(got, _reference(first, x, w), rtol=1e-4, atol=1e-4)
    held, at = got.copy(), got.ctypes.data
    again = np.asarray(kern(R=second, X=x, W=w))  # ``got`` is held: another array
    assert not np.shares_memory(again, got) and np.array_equal(got, held)
    assert np.allclose(again, _reference(second, x, w), rtol=1e-4, atol=1e-4)
    pooled = len(recycled._idle.get(nbytes, []))
    del again
    assert len(recycled._idle[nbytes]) == pooled + 1
    del got
    assert len(recycled._idle[nbytes]) == pooled + 2
    reused = np.asarray(kern(R=second, X=x, W=w))  # the last dropped: first's C
    assert reused.ctypes.data == at and len(recycled._idle[nbytes]) == pooled + 1
    assert np.allclose(reused, _reference(second, x, w), rtol=1e-4, atol=1e-4)
    assert not reused[0].any() and not reused[2].any()


def test_a_dropped_output_waits_in_the_pool_and_comes_back():
    """The pool hands a dropped buffer of the same size back as it was (not zeroed), once
    no view of it is left; smaller arrays are plain new zeros."""
    shape = (3, 1 << 19)  # 6 MB of float32
    nbytes = 3 * (1 << 19) * 4
    pooled = len(recycled._idle.get(nbytes, []))
    a, fresh = recycled.array(shape, np.float32)
    assert fresh and not a.any() and a.flags.c_contiguous and a.flags.writeable
    a[...] = 7
    at, view = a.ctypes.data, a[1]
    del a
    assert len(recycled._idle.get(nbytes, [])) == pooled
    del view
    assert len(recycled._idle[nbytes]) == pooled + 1
    b, fresh = recycled.array(shape, np.float32)
    assert not fresh and b.ctypes.data == at and b.shape == shape and (b == 7).all()
    assert len(recycled._idle[nbytes]) == pooled
    small, fresh = recycled.array((4, 4), np.float64)
    assert fresh and not small.any()


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_every_remainder_of_rows_past_the_last_tile(target):
    """Expert e gets e tokens (0 to 13): every count of rows past the last whole tile of
    6, on 43 columns (float64: panels of 8 and a tail of 3) and 20 d's; into a used out=
    whose other rows the kernel zeroes."""
    rng = np.random.default_rng(21)
    e, t, d, n = 14, 30, 20, 43
    r = np.zeros((e, t))
    for k in range(e):
        r[k, rng.choice(t, k, replace=False)] = rng.random(k) + 0.1
    x, w = rng.standard_normal((t, d)), rng.standard_normal((e, d, n))
    kern = ucf.compile(MOE, dynamic={"R": (1, 1)}, target=target)
    out = rng.standard_normal((e, t, n))
    kern(R=r, X=x, W=w, out=out)
    assert np.allclose(out, _reference(r, x, w))


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_the_assembly_of_the_condensed_kernel(target):
    """``k.asm`` of a dynamic kernel is its condensed kernel's machine code. Where the
    host has FMA, a loop body (a block between labels) holds the 6-row tile: 6
    broadcasts and 12 vector multiply-adds, no accumulator spilled to the stack."""
    kern = ucf.compile(MOE, dynamic={"R": (1, 1)}, dtype=np.float32, target=target)
    asm = kern.asm
    assert "ucf_condensed_rows_1" in asm
    if "vfmadd231ps\t" not in asm and "vfmadd231ps " not in asm:
        return
    blocks, block = [], []
    for line in asm.splitlines():
        if line.rstrip().endswith(":"):
            blocks.append(block)
            block = []
        elif line.strip():
            block.append(line.split()[0] if line.startswith(("\t", " ")) else "")
    blocks.append(block)
    tiles = [b for b in blocks if b.count("vfmadd231ps") == 12 and b.count("vbroadcastss") == 6]
    assert tiles, "no loop body with a 6 x 2 register tile"
