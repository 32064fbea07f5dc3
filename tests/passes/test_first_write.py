"""Register tiles of a block row's first block that start from zeros
(``ucf.passes.first_write``): the output's slice is zeroed only where that block does
not write all of it. Against numpy, and bit for bit against the nest without register
blocking (random floats, which round) and between llvm and c, over block shapes, float32
and float64, one and two threads, columns of B in whole tiles (the first block covers
its slice) or not (the slice is zeroed), empty block rows, a single block and no block;
each kernel runs twice on operands of different patterns into its recycled output, so
a row the first call wrote and the second leaves empty must come back zeroed."""

from __future__ import annotations

import numpy as np
import pytest

import ucf
from ucf.passes import first_write

SPMM = "C(i,j) = A(i,k) * B(k,j)"
#: Columns of B: a multiple of every tile's width, and one more than that.
WHOLE, TAIL = 128, 133


def blocks(rng, rows: int, cols: int, block: tuple[int, int], case: str, dtype) -> np.ndarray:
    """A ``rows x cols`` matrix of ``block`` blocks: ``spread`` about half the blocks
    (block rows 1 and 3 empty), ``single`` one block, ``none`` none."""
    grid = (rows // block[0], cols // block[1])
    live = np.zeros(grid, dtype=bool)
    if case == "spread":
        live = rng.random(grid) < 0.5
        live[:, 0] = True
        live[1] = live[3] = False
    elif case == "single":
        live[2, 1] = True
    mask = np.kron(live, np.ones(block))
    return (mask * rng.standard_normal((rows, cols))).astype(dtype)


def run(k, a, b, fmt):
    return k(A=ucf.from_numpy(a, format=fmt), B=b).to_numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("block", [(32, 32), (16, 16), (16, 8)], ids=str)
def test_first_blocks_write_their_slices(block, dtype, monkeypatch, tmp_path):
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("UCF_WORK_THRESHOLD", "0")  # two threads even on these sizes
    fmt = f"bcsr({block[0]},{block[1]})"
    name = np.dtype(dtype).name
    rng = np.random.default_rng(38)
    kernels = {
        t: ucf.compile(SPMM, formats={"A": fmt}, dtype=name, target=t) for t in ("llvm", "c")
    }
    assert "slice_covered" in kernels["c"].c_source
    assert "the tiles of the first step of k_blk start from zeros and write C's" in kernels["c"].cin
    monkeypatch.setenv("UCF_REGISTER_BLOCKING", "0")
    plain = ucf.compile(SPMM, formats={"A": fmt}, dtype=name, target="llvm")
    monkeypatch.delenv("UCF_REGISTER_BLOCKING")
    for threads in (1, 2):
        ucf.set_num_threads(threads)
        compare(kernels, plain, fmt, block, dtype, rng, threads)


def compare(kernels, plain, fmt, block, dtype, rng, threads):
    """Each kernel's result on each case, after a call on a full A into the output it
    recycles, against ``plain``'s and numpy's."""
    rows, depth = 5 * block[0], 3 * block[1]
    full = rng.standard_normal((rows, depth)).astype(dtype)
    for n in (WHOLE, TAIL):
        b = rng.standard_normal((depth, n)).astype(dtype)
        for case in ("spread", "single", "none"):
            a = blocks(rng, rows, depth, block, case, dtype)
            want = run(plain, a, b, fmt)
            np.testing.assert_allclose(want, a @ b, rtol=1e-5, atol=1e-4)
            for target, k in kernels.items():
                run(k, full, b, fmt)  # every row written, then recycled
                got = run(k, a, b, fmt)
                assert np.array_equal(got, want), (target, threads, n, case)


def test_a_slice_the_loop_does_not_follow_is_zeroed_by_the_kernel():
    """No claim without a loop over blocks around the nest: a dense A's rows are one
    loop, whose nest is not the only statement of a loop over blocks."""
    k = ucf.compile(SPMM, formats={"A": "dense"}, dtype="float32", target="c")
    assert "first_block" not in k.c_source


def test_the_claim_needs_the_slice_right_before_its_loop():
    """``apply`` leaves a claimed loop's flag at 0 when the statement before the loop is
    not the zeroing of the claimed array: the tiles then always load their places."""
    from ucf.ir import nodes as ir
    from ucf.ir.nodes import I64, Const, Var

    flag = Var("first_block0", I64)
    c = first_write.Claim(flag, "p", "C_vals", Const(0, I64), Var("n", I64), Var("n", I64), 4, 32)
    loop = ir.For(Var("p", I64), Const(0, I64), Var("m", I64), [ir.Decl(flag, Const(0, I64))])
    other = ir.Array("D_vals", "f32", output=True)
    q = Var("q", I64)
    zero = ir.For(
        q,
        Const(0, I64),
        Var("n", I64),
        [ir.Store(other, ir.add(Var("x", I64), q), Const(0.0, "f32"))],
    )
    fn = ir.Function("kernel", [], [zero, loop])
    assert first_write.apply(fn, [c]) == (fn, [])
