"""Choosing a dynamic operand's micro-tile and compute tile from sample masks (SparDA's
Algorithm 2).

A fine micro-tile covers a mask's nonzeros tightly but pays per tile; a coarse
one computes zeros but reads its tiles with fewer, longer loops.  SparDA picks,
among candidate tiles, the one whose cover of a few representative masks costs
least: the number of live tiles (``stile_index`` counts them) times the
measured cost of a tile.  Here a candidate's cost is measured on the target by
running its dynamic kernel once over a full mask and once over an empty one
(the fixed cost of a call, and the cost of a live tile from their difference),
and kept for the process, so a later choice for the same operator and shapes
costs only the covers.  Where the statement runs a kernel that gathers compute
tiles (``ucf.stile.gathered``), each candidate micro-tile is measured at every
candidate depth of the compute tile (``condense(k, A, depth)``), and the pair that
costs least wins: the depth trades the packing of the dense operand, repeated once
per compute tile, against the caches the gathered tiles must fit.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ucf.errors import ArgumentError, OperandError, boundary
from ucf.lang import ast
from ucf.lang.parser import parse_statement
from ucf.schedule.requests import Condense
from ucf.stile import gathered, tile_index
from ucf.toolchain import cache
from ucf.toolchain.jit import num_threads

MATMUL = "C(i,n) = A(i,k) * B(k,n)"


@dataclass(frozen=True)
class StileChoice:
    """The chosen micro-tile and compute-tile depth, and for every candidate micro-tile
    its estimated seconds over the samples (at its best depth), its live tiles per
    sample and its best depth. A depth is None where the kernel gathers no compute
    tiles (the statement runs through the generic rewrite), or gathers none of the
    depths asked (the micro-tiles are too large): it was measured without a schedule."""

    granularity: tuple[int, ...]
    costs: dict[tuple[int, ...], float]
    live: dict[tuple[int, ...], list[int]]
    depth: int | None = None
    depths: dict[tuple[int, ...], int | None] = field(default_factory=dict)


@boundary
def choose_stile(
    samples: Sequence[Any],
    candidates: Sequence[tuple[int, ...]],
    operands: Mapping[str, Any] | None = None,
    statement: str = MATMUL,
    operand: str = "A",
    target: str = "llvm",
    dtype: Any = np.float32,
    depths: Sequence[int] | None = None,
) -> StileChoice:
    """The candidate micro-tile of ``operand``, and the compute-tile depth, whose cover
    of the sample masks costs least:
    ``ucf.choose_stile([m1, m2], [(1, 1), (32, 1)], operands={"B": b})``.

    ``operands`` are the statement's other operands, as a call would pass them (the
    tile costs are measured with them, on ``target``, once: kept in the kernel cache
    under the statement, shapes, candidate, depth, target, thread count and ucf's
    code version, as ``Policy(blocks="measure")`` keeps its block costs). The samples
    are masks of the dynamic operand's shape. ``depths`` are
    the compute-tile depths tried where the kernel gathers compute tiles (each one a
    compile and a measurement per candidate; None: the kernels' default depth
    alone); compile with the choice as ``schedule=f"condense(k, A, {choice.depth})"``.
    """
    if not samples:
        raise OperandError("choose_stile needs at least one sample mask")
    masks = [tile_index.mask_array(m, f"sample {k}") for k, m in enumerate(samples)]
    shape = masks[0].shape
    for k, m in enumerate(masks):
        if m.shape != shape:
            raise OperandError(
                f"choose_stile: sample {k} has shape {m.shape} but sample 0 has {shape}"
            )
    tiles = [tile_index.check_granularity(g, len(shape), "choose_stile") for g in candidates]
    if not tiles:
        raise OperandError("choose_stile needs at least one candidate micro-tile")
    if operands is not None and not isinstance(operands, Mapping):
        raise ArgumentError(
            f"choose_stile: operands= takes a dict by name, got {type(operands).__name__}"
        )
    _check_operands(statement, operand, operands)
    asked = None if depths is None else _depths(depths)
    costs, live, best_depth = {}, {}, {}
    for g in tiles:
        live[g] = [tile_index.build(m, g, target).nnz for m in masks]
        options = {}
        for depth in _gathering_depths(statement, operand, g, dtype, asked):
            fixed, per_tile = _tile_cost(
                statement, operand, g, depth, shape, operands or {}, target, dtype
            )
            options[depth] = sum(fixed + n * per_tile for n in live[g])
        best_depth[g] = min(options, key=lambda d: options[d])
        costs[g] = options[best_depth[g]]
    best = min(tiles, key=lambda g: costs[g])
    return StileChoice(best, costs, live, best_depth[best], best_depth)


def _check_operands(statement: str, operand: str, operands: Mapping[str, Any] | None) -> None:
    """The costs are measured by running the statement, so every operand but the dynamic
    one (which the samples stand for) must be given, and nothing else."""
    reads = sorted({a.tensor for a in ast.accesses(parse_statement(statement).rhs)})
    if operand not in reads:
        raise OperandError(
            f"choose_stile: operand={operand!r} is not an operand of {statement} "
            f"(operands: {', '.join(reads)})"
        )
    given = dict(operands or {})
    missing = [n for n in reads if n != operand and n not in given]
    if missing:
        example = ", ".join(f"{n!r}: {n.lower()}" for n in missing)
        raise OperandError(
            f"choose_stile times {statement} on its operands, so it needs operands= with "
            f"{', '.join(missing)} (as a call of the kernel passes them, e.g. "
            f"operands={{{example}}}); the samples stand for {operand}"
        )
    unknown = sorted(set(given) - set(reads) | ({operand} & set(given)))
    if unknown:
        raise OperandError(
            f"choose_stile: operands= gives {unknown[0]}, which is not an operand of "
            f"{statement} other than the dynamic {operand} (operands: {', '.join(reads)})"
        )


def _depths(depths: Sequence[int]) -> list[int]:
    """The candidate depths, checked: positive integers up to the kernels' largest."""
    if not isinstance(depths, Iterable) or isinstance(depths, str):
        raise ArgumentError(
            f"choose_stile: depths= takes a list of depths, got {type(depths).__name__}"
        )
    found = list(depths)
    if not found:
        raise OperandError("choose_stile needs at least one compute-tile depth")
    for d in found:
        if isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 1:
            raise OperandError(f"choose_stile: a compute-tile depth is a positive int, got {d!r}")
        if d > gathered.MAX_DEPTH:
            raise OperandError(
                f"choose_stile: a compute tile gathers at most {gathered.MAX_DEPTH}, got {d}"
            )
    return [int(d) for d in found]


def _gathering_depths(
    statement: str,
    operand: str,
    granularity: tuple[int, ...],
    dtype: Any,
    depths: list[int] | None,
) -> list[int | None]:
    """The depths to measure ``granularity`` at: those whose gathered tiles the kernel
    can hold (None asked: the kernel's default), or [None] where it gathers no compute
    tiles (or none of them fits)."""
    stmt, dt = parse_statement(statement), np.dtype(dtype)
    shape = gathered.match(stmt, operand, granularity, {}, dt, None)
    if shape is None:
        return [None]
    if depths is None:
        return [shape.depth]
    return [d for d in depths if gathered.fits(shape.kind, dt, granularity, d)] or [None]


def _schedule(statement: str, operand: str, depth: int | None) -> list[Condense] | None:
    """``condense(k, A, depth)`` for the dynamic operand's last variable k."""
    if depth is None:
        return None
    access = next(a for a in ast.accesses(parse_statement(statement).rhs) if a.tensor == operand)
    return [Condense(access.indices[-1].single_variable, operand, depth)]


def _tile_cost(
    statement: str,
    operand: str,
    granularity: tuple[int, ...],
    depth: int | None,
    shape: tuple[int, ...],
    operands: Mapping[str, Any],
    target: str,
    dtype: Any,
) -> tuple[float, float]:
    """(seconds per call, seconds per live tile) of the dynamic kernel gathering ``depth``
    deep (None: one that gathers no compute tiles), measured once."""
    from ucf.stile.dynamic import DynamicKernel

    arrays = {n: np.asarray(v) for n, v in operands.items()}
    fields = {
        "kind": "stile tile cost",
        "statement": statement,
        "operand": operand,
        "granularity": list(granularity),
        "depth": depth,
        "shape": list(shape),
        "operands": sorted([n, list(a.shape), a.dtype.str] for n, a in arrays.items()),
        "target": target,
        "dtype": np.dtype(dtype).str,
        "threads": num_threads(),
    }
    name = f"{cache.key(fields)}.cost"
    cost = cache.load(name, fields)
    if cost is not None:
        return cost
    kernel = DynamicKernel(
        statement,
        None,
        _schedule(statement, operand, depth),
        target,
        dtype,
        "int32",
        {operand: granularity},
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

    tiles = tile_index.build(full.view(np.uint8), granularity, target).nnz
    t_empty = seconds(empty)
    cost = (t_empty, max(seconds(full) - t_empty, 0.0) / max(tiles, 1))
    cache.store(name, fields, cost)
    return cost
