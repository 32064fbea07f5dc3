"""The kernels behind the linear layers: a layer's product and its derived gradients,
each compiled for the layout its loops want.

A layer computes ``Y(o,t) = W(o,i) * X(i,t)``: the activations are held
transposed, feature-major, so that the innermost loops run along the tokens ``t``
in vectors (ucf's register tiles over a blocked weight, and SparDA's gathered
tiles over a dynamic one). A layer returns ``Y`` as the transposed view of that
array, so the next layer (after torch's element-wise activation, which keeps the
layout) reads it as it is. The gradients are the statements ``ucf.autodiff``
derives from the product, each given the layout that suits it:

- ``grad_X(i,t) = sum(o, grad_Y(o,t) * W(o,i))``, with ``W`` read column-major
  (a static pattern converted once, its values permuted each step; a dynamic
  weight with tiles at least 8 wide transposed each step, so that the gathered
  kernel runs; narrower tiles read ``W`` in place, over the live tiles, with the
  tokens split across the threads);
- ``grad_W(o,i) = sum(t, pattern_W(o,i) * grad_Y(o,t) * X(t,i))``, only at the
  weight's stored positions (an SDDMM): ``X`` row-major under blocks (register
  tiles along a block's columns), transposed under single elements (a dot along
  ``t``). A dynamic weight in tiles at least 8 high computes it as batched
  products, one per row of tiles over its live tiles only: ``C(e,i,n) = R(e,i) *
  X(i,t) * G(e,t,n)`` with ``e`` the tile row and ``n`` the place in it, the
  gathered kernel ucf runs Mixture-of-Experts layers with.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ucf.autodiff import derive
from ucf.autodiff.backward import writable
from ucf.exec.kernel import Kernel
from ucf.format.construction import trusted
from ucf.format.format import Format
from ucf.format.tensor import Tensor
from ucf.lang.parser import parse_statement
from ucf.schedule.commands import Command, Parallelize, Reorder, SplitCommand
from ucf.schedule.records import Parallel

_LOCK = threading.Lock()
_PLANS: dict[tuple, Any] = {}

#: The layer's product, its activations feature-major; and with X row-major, from
#: which the weight's gradient under blocks is derived.
PRODUCT = "Y(o,t) = W(o,i) * X(i,t)"
PRODUCT_ROWS = "Y(o,t) = W(o,i) * X(t,i)"
#: A dynamic weight's gradient as a product per row of tiles (see the module's text).
TILE_ROWS = "C(e,i,n) = R(e,i) * X(i,t) * G(e,t,n)"

#: Tiles at least this wide (high) take the transposed (batched) kernels.
WIDE = 8


def cached(key: tuple, build: Any) -> Any:
    with _LOCK:
        found = _PLANS.get(key)
    if found is None:
        found = build()
        with _LOCK:
            found = _PLANS.setdefault(key, found)
    return found


def _derived(stmt: str, wrt: str, keep_pattern: bool = False) -> str:
    return str(derive(parse_statement(stmt), wrt, keep_pattern).statement)


def column_format(fmt: Format) -> Format:
    """The format holding the same matrix column by column (blocks kept)."""
    if _blocks(fmt):
        bh, bw = fmt.maps[2].mod, fmt.maps[3].mod
        return Format.blocked_rows(bh, bw, columns=True)
    return Format.compressed(2, 1, mode_order=(1, 0))


def _blocks(fmt: Format) -> bool:
    """Whether ``fmt`` stores a matrix in blocks of rows and columns (BCSR)."""
    return len(fmt.maps) == 4 and all(m.mod for m in fmt.maps[2:])


class StaticPlan:
    """``SparseLinear``'s kernels for one weight format and dtype."""

    def __init__(self, fmt: Format, dtype: np.dtype, index_dtype: np.dtype):
        self.fmt, self.dtype, self.index_dtype = fmt, dtype, index_dtype
        self.columns = column_format(fmt.structure)
        self.forward = Kernel(PRODUCT, {"W": fmt}, None, "llvm", dtype, index_dtype)
        grad_x = _derived(PRODUCT, "X")
        self.grad_x = Kernel(grad_x, {"W": self.columns}, None, "llvm", dtype, index_dtype)
        formats = {"pattern_W": fmt.structure, "grad_W": writable(fmt)}
        if _blocks(fmt):
            loops = ("o_blk", "i_blk", "o_in", "t_o", "t_i", "i_in")
            schedule = _rows_in_threads("o_blk", 64, loops)
            self.rows = True
            stmt = _derived(PRODUCT_ROWS, "W", keep_pattern=True)
        else:
            schedule, self.rows = None, False
            stmt = _derived(PRODUCT, "W", keep_pattern=True)
        self.grad_w = Kernel(stmt, formats, schedule, "llvm", dtype, index_dtype)

    @staticmethod
    def get(fmt: Format, dtype: np.dtype, index_dtype: np.dtype) -> StaticPlan:
        key = ("static", str(fmt), str(dtype), str(index_dtype))
        return cached(key, lambda: StaticPlan(fmt, dtype, index_dtype))


class DynamicPlan:
    """``DynamicSparseLinear``'s kernels for one micro-tile and dtype."""

    def __init__(self, tile: tuple[int, int], dtype: np.dtype):
        gh, gw = tile
        self.tile, self.dtype = tile, dtype
        self.forward = _dynamic(PRODUCT, {"W": tile}, None, dtype)
        self.transposed = gw >= WIDE
        if self.transposed:
            stmt = "grad_X(i,t) = sum(o, W(i,o) * grad_Y(o,t))"  # W held transposed
            self.grad_x = _dynamic(stmt, {"W": (gw, gh)}, None, dtype)
        else:
            o = "o_blk" if gh > 1 else "o"
            i = "i_blk" if gw > 1 else "i"
            inner = [v for v in ("o_in" if gh > 1 else "", "i_in" if gw > 1 else "") if v]
            schedule = _rows_in_threads("t_o", 512, ("t_o", o, i, *inner, "t_i"))
            self.grad_x = _dynamic(_derived(PRODUCT, "X"), {"W": tile}, schedule, dtype)
        self.rows_of_tiles = gh >= WIDE
        self.grad_w_rows = _dynamic(TILE_ROWS, {"R": (1, gw)}, None, dtype) if gh >= WIDE else None
        self._grad_w: Any = None

    @property
    def grad_w(self) -> Any:
        """The derived weight gradient over the live tiles of its pattern (compiled on
        first need where the products per row of tiles serve)."""
        if self._grad_w is None:
            stmt = _derived(PRODUCT, "W", keep_pattern=True)
            self._grad_w = _dynamic(stmt, {"pattern_W": self.tile}, None, self.dtype)
        return self._grad_w

    @staticmethod
    def get(tile: tuple[int, int], dtype: np.dtype) -> DynamicPlan:
        return cached(("dynamic", tile, str(dtype)), lambda: DynamicPlan(tile, dtype))


def _dynamic(stmt: str, dynamic: dict, schedule: list[Command] | None, dtype: np.dtype) -> Any:
    from ucf.stile.dynamic import DynamicKernel

    return DynamicKernel(stmt, {}, schedule, "llvm", dtype, np.int32, dynamic)


def _rows_in_threads(parallel: str, rows: int, loops: tuple[str, ...]) -> list[Command]:
    """``t`` (the batch's rows) split in ``rows``, the loops in ``loops`` order, and loop
    ``parallel`` on threads."""
    return [
        SplitCommand("t", "t_o", "t_i", rows),
        Reorder(loops),
        Parallelize(parallel, Parallel("CPUThread", "NoRaces")),
    ]


def dense(a: np.ndarray) -> Tensor:
    """A C-contiguous array as a dense Tensor, without a copy."""
    return trusted(a.shape, Format.dense(a.ndim), [{} for _ in a.shape], a.reshape(-1))
