"""``fuse`` plus ``pos`` over the upper levels of a tensor with levels below them.

Regression tests for issue 19: the fused loop walked its own tensor's dense
level as if another operand located it, so the levels below were skipped
(``B_vals`` was read at a level-1 position), and a fused walk over a
non-unique level overwrote the output where its coordinates repeat.
"""

from __future__ import annotations

import numpy as np
import pytest

import ucf
from tests.helpers import TARGETS

FORMATS = ["UCC", "CCC", "CCS", "UCS", "CSS", "UCU", "CCU"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fb", FORMATS)
def test_the_issue_repro(target, fb):
    B = np.zeros((1, 1, 16))
    B[0, 0, 3] = 2.0
    B[0, 0, 9] = 1.0
    c = np.arange(16.0) - 5
    k = ucf.compile(
        "A(i,j) = B(i,j,k)*c(k)",
        formats={"B": fb},
        schedule="fuse(i,j,f); pos(f,fp,B)",
        target=target,
    )
    np.testing.assert_array_equal(k(B=ucf.from_numpy(B, format=fb), c=c).to_numpy(), [[0.0]])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fb", FORMATS)
@pytest.mark.parametrize(
    "schedule",
    [
        "fuse(i,j,f); pos(f,fp,B)",
        "fuse(i,j,f); pos(f,fp,B); split(fp,f0,f1,3)",
        "fuse(i,j,f); fuse(f,k,g); pos(g,gp,B)",
    ],
)
def test_mttkrp_with_fused_positions(target, fb, schedule):
    rng = np.random.default_rng(19)
    B = rng.integers(-3, 4, (5, 6, 7)) * (rng.random((5, 6, 7)) < 0.3)
    C, D = rng.integers(-3, 4, (6, 4)), rng.integers(-3, 4, (7, 4))
    B, C, D = (x.astype(float) for x in (B, C, D))
    try:
        k = ucf.compile(
            "A(i,l) = B(i,j,k)*C(j,l)*D(k,l)", formats={"B": fb}, schedule=schedule, target=target
        )
    except ucf.ScheduleError as e:
        assert "dense (U) level" in str(e)  # pos over a U level has no positions
        return
    got = k(B=ucf.from_numpy(B, format=fb), C=C, D=D).to_numpy()
    np.testing.assert_array_equal(got, np.einsum("ijk,jl,kl->il", B, C, D))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fb", ["UCC", "CCS"])
def test_mttkrp_fused_over_i_and_k(target, fb):
    """The issue's second repro: fuse(i,k,f); pos(f,fp,B) with B stored i, k, l."""
    rng = np.random.default_rng(7)
    B = rng.integers(-3, 4, (4, 5, 6)) * (rng.random((4, 5, 6)) < 0.4)
    C, D = rng.integers(-3, 4, (5, 3)), rng.integers(-3, 4, (6, 3))
    B, C, D = (x.astype(float) for x in (B, C, D))
    k = ucf.compile(
        "A(i,j) = B(i,k,l)*C(k,j)*D(l,j)",
        formats={"B": fb},
        schedule="reorder(i,k,l,j); fuse(i,k,f); pos(f,fp,B)",
        target=target,
    )
    got = k(B=ucf.from_numpy(B, format=fb), C=C, D=D).to_numpy()
    np.testing.assert_array_equal(got, np.einsum("ikl,kj,lj->ij", B, C, D))
