"""Splitting a mask into parts that simple kernels compute well (SparTA §3.3 and §5.3).

``block_cover`` is SparTA's weighted block cover: every kept element must be
covered by an aligned block of one of the candidate shapes, each shape with a
cost per block (what a kernel over such blocks costs on this machine), and the
greedy algorithm for weighted set cover picks, again and again, the block that
costs least per element it newly covers. ``nm_split`` is the split for sparse
tensor cores: an N:M part that the hardware accepts and the remainder.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ucf.errors import OperandError, boundary

Block = tuple[tuple[int, ...], tuple[int, ...]]  # (shape, origin)


@boundary
def block_cover(
    mask: np.ndarray, costs: Mapping[tuple[int, ...], float]
) -> tuple[list[Block], float]:
    """Aligned blocks covering every True element of ``mask``, and their total cost.

    ``costs`` maps a block shape to its cost per block. A block's origin is a
    multiple of its shape; blocks at the edge may reach past the tensor (their
    outside is padding). Among blocks of equal cost per newly covered element the
    larger is taken, then the first in row-major order, so the cover is
    deterministic. Blocks of one shape never overlap, so all the blocks of the
    cheapest shape at the cheapest ratio are taken in one step, as taking them one
    by one would.
    """
    mask = np.asarray(mask, dtype=bool)
    shapes = _check_costs(mask, costs)
    uncovered = mask.copy()
    chosen: list[Block] = []
    total = 0.0
    while uncovered.any():
        best = None
        for shape in shapes:
            counts = _block_counts(uncovered, shape)
            with np.errstate(divide="ignore"):
                ratio = np.where(counts > 0, costs[shape] / counts, np.inf)
            low = ratio.min()
            key = (low, -int(np.prod(shape)))
            if best is None or key < best[0]:
                best = (key, shape, ratio == low)
        _, shape, picked = best
        for corner in np.argwhere(picked):
            origin = tuple(int(c) * b for c, b in zip(corner, shape, strict=True))
            chosen.append((shape, origin))
            uncovered[tuple(slice(o, o + b) for o, b in zip(origin, shape, strict=True))] = False
            total += costs[shape]
    return chosen, total


def _check_costs(mask: np.ndarray, costs: Mapping[tuple[int, ...], float]) -> list[tuple]:
    shapes = [tuple(int(b) for b in s) for s in costs]
    if not shapes:
        raise OperandError("block_cover: costs must give at least one block shape")
    for shape in shapes:
        if len(shape) != mask.ndim or min(shape) < 1:
            raise OperandError(
                f"block_cover: block shape {shape} does not fit a mask of shape {mask.shape}"
            )
        if not costs[shape] > 0:
            raise OperandError(f"block_cover: the cost of {shape} blocks must be positive")
    return shapes


def _block_counts(mask: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The number of True elements in each aligned block of ``shape``."""
    grid = [-(-n // b) for n, b in zip(mask.shape, shape, strict=True)]
    padded = np.zeros([g * b for g, b in zip(grid, shape, strict=True)], dtype=np.int64)
    padded[tuple(slice(0, n) for n in mask.shape)] = mask
    split = [d for g, b in zip(grid, shape, strict=True) for d in (g, b)]
    return padded.reshape(split).sum(axis=tuple(range(1, 2 * mask.ndim, 2)))


@boundary
def nm_split(mask: np.ndarray, n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """``(nm_mask, remainder_mask)``: the first ``n`` kept elements of every group of
    ``m`` consecutive elements along the last axis, and the kept elements left over.

    The two are disjoint and together are ``mask``; ``nm_mask`` has at most ``n``
    elements in every group (2:4 for sparse tensor cores). A last axis that ``m``
    does not divide ends in a shorter group.
    """
    mask = np.asarray(mask, dtype=bool)
    if not 0 < n <= m:
        raise OperandError(f"nm_split: need 0 < n <= m, got {n}:{m}")
    if mask.ndim == 0:
        raise OperandError("nm_split: the mask needs at least one axis")
    width = mask.shape[-1]
    padded = np.zeros((*mask.shape[:-1], -(-width // m) * m), dtype=bool)
    padded[..., :width] = mask
    groups = padded.reshape(*mask.shape[:-1], -1, m)
    rank = np.cumsum(groups, axis=-1)  # 1 for the first kept element of a group, ...
    nm = (groups & (rank <= n)).reshape(padded.shape)[..., :width]
    return nm, mask & ~nm
