"""The default's split of bcsr SpMM's block rows on two threads (``ucf.schedule.block_rows``):
where the call stores few blocks a block column and B's panels are large, so that the
tiles read B in place, the block rows keep the static split (unless it gives a thread
over ``block_rows.SHARE`` of its share) (a thread's rows follow each
other, and each block prefetches the next one's rows of B across rows); elsewhere heavy
block rows unevenly split still go in dynamic chunks of one. Either way every block row
is summed in the same order: the result is bit for bit the one-thread kernel's, and
numpy's to rounding. Ragged extents (partial blocks, a tail of columns after the tiles),
llvm and c."""

from __future__ import annotations

import numpy as np
import pytest

import ucf
from tests.helpers import TARGETS
from ucf.toolchain import jit

SPMM = "C(i,j) = A(i,k) * B(k,j)"
FMT = "bcsr(32,32)"
#: 300 x 520 over blocks of 32: 10 block rows (the last partial) and 17 block columns.
M, K = 300, 520
#: Blocks stored in each block row: the first half of the rows holds more, so a static
#: split gives one of two threads over 1.02x its share (heavy rows then go in chunks).
FEW = [3, 3, 3, 3, 2, 2, 2, 2, 2, 2]  # 24 blocks: 1.4 a block column; 1.17x the share
MANY = [10, 10, 10, 10, 10, 7, 7, 7, 7, 7]  # 85 blocks: 5 a block column; 1.18x
UNEVEN = [4, 4, 3, 3, 3, 1, 1, 1, 1, 1]  # 22 blocks: 1.3 a block column; 1.55x
STATIC = "shared out statically"
CHUNKS = "dynamically scheduled chunks of 1 "


def blocked(rng, per_row: list[int]) -> np.ndarray:
    """A whose block row ``r`` stores ``per_row[r]`` blocks at random block columns."""
    live = np.zeros((len(per_row), -(-K // 32)), bool)
    for r, n in enumerate(per_row):
        live[r, rng.choice(live.shape[1], n, replace=False)] = True
    mask = np.kron(live, np.ones((32, 32)))[:M, :K]
    return (mask * rng.standard_normal((M, K))).astype(np.float32)


def split(k: ucf.Kernel) -> str:
    """How the chosen kernel shares out i_blk: the model's line about it."""
    return next(line for line in k.cin.splitlines() if "default: i_blk " in line)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("per_row", "n", "plan"),
    [
        (FEW, 600, STATIC),  # 17 panels of 75 KB: 1.3 MB, over NEAR_BYTES: in place
        (MANY, 600, CHUNKS),  # 5 blocks a block column: packed
        (FEW, 200, CHUNKS),  # 17 panels of 25 KB: packed (they stay in L2)
        (UNEVEN, 600, CHUNKS),  # in place, but a static split over block_rows.SHARE
        ([17] * 10, 600, STATIC),  # no zero block: even rows, static as before
        ([0] * 10, 600, STATIC),  # every block zero: the plan compiled before any call
    ],
    ids=["few-wide", "many-wide", "few-narrow", "uneven-wide", "full", "empty"],
)
def test_block_rows_split_by_what_the_tiles_read(monkeypatch, tmp_path, target, per_row, n, plan):
    monkeypatch.setenv("UCF_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(89)
    fixed = jit.set_whole_team(True)
    try:
        ucf.set_num_threads(1)  # conftest restores the count
        alone = ucf.compile(SPMM, formats={"A": FMT}, dtype="float32", target=target)
        ucf.set_num_threads(2)
        k = ucf.compile(SPMM, formats={"A": FMT}, dtype="float32", target=target)
        for _ in range(2):  # two matrices of the same counts: the plan kept, B fresh
            a, b = blocked(rng, per_row), rng.standard_normal((K, n)).astype(np.float32)
            t = ucf.from_numpy(a, format=FMT)
            got = k(A=t, B=b).to_numpy()
            assert plan in split(k), k.cin
            np.testing.assert_array_equal(got, alone(A=t, B=b).to_numpy())
            np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    finally:
        jit.set_whole_team(fixed)
