"""Bit rounding, weighted block cover and the N:M split (issue 15, item 4's building blocks).

Expected results are SparTA's examples worked by hand (Fig. 3, Fig. 6) and the
covers the issue lists as optimal; random masks are checked for the properties
a cover and a split must have, the split against a loop over the groups.
"""

from __future__ import annotations

import numpy as np
import pytest

import ucf
from ucf.tesa import bit_rounding, block_cover, nm_split

FIG3 = np.array([[4, 4, 4], [0, 0, 0], [4, 4, 8]])


def test_bit_rounding_fig3_on_4_and_8_bit_hardware():
    options = bit_rounding(ucf.TeSA(FIG3), hardware={4, 8})
    assert [o.bits.tolist() for o in options] == [
        FIG3.tolist(),
        [[8, 8, 8], [0, 0, 0], [8, 8, 8]],
    ]


def test_bit_rounding_fig3_on_8_bit_hardware():
    options = bit_rounding(ucf.TeSA(FIG3), hardware={8})
    assert [o.bits.tolist() for o in options] == [[[8, 8, 8], [0, 0, 0], [8, 8, 8]]]


def test_bit_rounding_rounds_up_and_keeps_the_block_hint():
    t = ucf.TeSA(np.array([[3, 0], [5, 12]]), block=(1, 2))
    options = bit_rounding(t, hardware=[4, 8, 16])
    assert [o.bits.tolist() for o in options] == [
        [[4, 0], [8, 16]],
        [[8, 0], [8, 16]],
        [[16, 0], [16, 16]],
    ]
    assert all(o.block == (1, 2) for o in options)
    with pytest.raises(ucf.OperandError, match="12 bits"):
        bit_rounding(t, hardware={4, 8})


COSTS = {(1, 1): 1.0, (2, 2): 2.5, (4, 4): 8.0}


def test_block_cover_a_full_block_and_a_stray_element():
    mask = np.zeros((4, 4), dtype=bool)
    mask[:2, :2] = True
    mask[3, 3] = True
    blocks, cost = block_cover(mask, COSTS)
    assert sorted(blocks) == [((1, 1), (3, 3)), ((2, 2), (0, 0))]
    assert cost == pytest.approx(3.5)


def test_block_cover_nearly_full_takes_one_big_block():
    mask = np.ones((4, 4), dtype=bool)
    mask[0, 3] = mask[2, 1] = False
    assert block_cover(mask, COSTS) == ([((4, 4), (0, 0))], 8.0)


def test_block_cover_diagonal_takes_single_elements():
    blocks, cost = block_cover(np.eye(4, dtype=bool), COSTS)
    assert sorted(blocks) == [((1, 1), (k, k)) for k in range(4)] and cost == 4.0


@pytest.mark.parametrize("seed", range(4))
def test_block_cover_covers_exactly_the_kept_elements(seed):
    rng = np.random.default_rng(seed)
    mask = np.kron(rng.random((3, 5)) < 0.3, np.ones((4, 4), dtype=bool))[:11, :18]
    mask |= rng.random(mask.shape) < 0.05
    costs = {(1, 1): 1.0, (4, 4): 6.0, (2, 8): 7.0}
    blocks, cost = block_cover(mask, costs)
    covered = np.zeros((12, 24), dtype=bool)
    for shape, origin in blocks:
        assert all(o % b == 0 for o, b in zip(origin, shape, strict=True))
        window = tuple(slice(o, o + b) for o, b in zip(origin, shape, strict=True))
        assert mask[window].any()  # no block covers only padding or pruned elements
        covered[window] = True
    assert (covered[:11, :18] >= mask).all()
    assert cost == pytest.approx(sum(costs[s] for s, _ in blocks))
    assert cost <= mask.sum()  # never worse than single elements alone


@pytest.mark.parametrize("n, m", [(2, 4), (1, 2), (3, 3), (2, 5)])
def test_nm_split_against_a_loop(n, m):
    rng = np.random.default_rng(n * 10 + m)
    mask = rng.random((6, 13)) < 0.6
    nm, rest = nm_split(mask, n, m)
    expected = np.zeros_like(mask)
    for r in range(mask.shape[0]):
        for start in range(0, mask.shape[1], m):
            taken = 0
            for c in range(start, min(start + m, mask.shape[1])):
                if mask[r, c] and taken < n:
                    expected[r, c] = True
                    taken += 1
    assert (nm == expected).all()
    assert not (nm & rest).any() and ((nm | rest) == mask).all()


def test_cover_and_split_refuse_bad_arguments():
    with pytest.raises(ucf.OperandError):
        block_cover(np.ones((4, 4), dtype=bool), {(2,): 1.0})
    with pytest.raises(ucf.OperandError):
        block_cover(np.ones((4, 4), dtype=bool), {(2, 2): 0.0})
    with pytest.raises(ucf.OperandError):
        nm_split(np.ones((4, 4), dtype=bool), 3, 2)
