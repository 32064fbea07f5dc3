"""Choosing a dynamic operand's micro-tile from sample masks (SparDA's Algorithm 2).

A fine micro-tile covers a mask's nonzeros tightly but pays per tile; a coarse
one computes zeros but reads its tiles with fewer, longer loops.  SparDA picks,
among candidate tiles, the one whose cover of a few representative masks costs
least: the number of live tiles (``stile_index`` counts them) times the
measured cost of a tile.  Here a candidate's cost is measured on the target by
running its dynamic kernel once over a full mask and once over an empty one
(the fixed cost of a call, and the cost of a live tile from their difference),
and kept for the process, so a later choice for the same operator and shapes
costs only the covers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ucf import stile
from ucf.errors import OperandError, boundary
from ucf.exec.jit import num_threads

MATMUL = "C(i,n) = A(i,k) * B(k,n)"

# A candidate's (fixed seconds per call, seconds per live tile), by operator, shapes,
# candidate, target and thread count: measured once per process.
_MEASURED: dict[tuple, tuple[float, float]] = {}


@dataclass(frozen=True)
class StileChoice:
    """The chosen micro-tile, and for every candidate its estimated seconds over the
    samples and its live tiles per sample."""

    granularity: tuple[int, ...]
    costs: dict[tuple[int, ...], float]
    live: dict[tuple[int, ...], list[int]]


@boundary
def choose_stile(
    samples: Sequence[Any],
    candidates: Sequence[tuple[int, ...]],
    operands: Mapping[str, Any] | None = None,
    statement: str = MATMUL,
    operand: str = "A",
    target: str = "llvm",
    dtype: Any = np.float32,
) -> StileChoice:
    """The candidate micro-tile of ``operand`` whose cover of the sample masks costs
    least: ``ucf.choose_stile([m1, m2], [(1, 1), (32, 1)], operands={"B": b})``.

    ``operands`` are the statement's other operands, as a call would pass them (the
    tile costs are measured with them, on ``target``, and remembered for the
    process). The samples are masks of the dynamic operand's shape.
    """
    if not samples:
        raise OperandError("choose_stile needs at least one sample mask")
    masks = [stile.mask_array(m, f"sample {k}") for k, m in enumerate(samples)]
    shape = masks[0].shape
    for k, m in enumerate(masks):
        if m.shape != shape:
            raise OperandError(
                f"choose_stile: sample {k} has shape {m.shape} but sample 0 has {shape}"
            )
    tiles = [stile.check_granularity(g, len(shape), "choose_stile") for g in candidates]
    if not tiles:
        raise OperandError("choose_stile needs at least one candidate micro-tile")
    costs, live = {}, {}
    for g in tiles:
        fixed, per_tile = _tile_cost(statement, operand, g, shape, operands or {}, target, dtype)
        live[g] = [stile.build(m, g, target).nnz for m in masks]
        costs[g] = sum(fixed + n * per_tile for n in live[g])
    best = min(tiles, key=lambda g: costs[g])
    return StileChoice(best, costs, live)


def _tile_cost(
    statement: str,
    operand: str,
    granularity: tuple[int, ...],
    shape: tuple[int, ...],
    operands: Mapping[str, Any],
    target: str,
    dtype: Any,
) -> tuple[float, float]:
    """(seconds per call, seconds per live tile) of the dynamic kernel, measured once."""
    from ucf.exec.dynamic import DynamicKernel

    arrays = {n: np.asarray(v) for n, v in operands.items()}
    key = (
        statement,
        operand,
        granularity,
        shape,
        tuple(sorted((n, a.shape, a.dtype.str) for n, a in arrays.items())),
        target,
        np.dtype(dtype).str,
        num_threads(),
    )
    if key not in _MEASURED:
        kernel = DynamicKernel(
            statement, None, None, target, dtype, "int32", {operand: granularity}
        )
        data = np.ones(shape, dtype=kernel.dtype)
        full, empty = np.ones(shape, bool), np.zeros(shape, bool)

        def seconds(mask: np.ndarray) -> float:
            kernel(**arrays, **{operand: data}, masks={operand: mask})  # warm
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                kernel(**arrays, **{operand: data}, masks={operand: mask})
                times.append(time.perf_counter() - t0)
            return min(times)

        tiles = stile.build(full.view(np.uint8), granularity, target).nnz
        t_empty = seconds(empty)
        _MEASURED[key] = (t_empty, max(seconds(full) - t_empty, 0.0) / max(tiles, 1))
    return _MEASURED[key]
