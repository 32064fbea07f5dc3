"""Level storage below the Tensor class: shapes, where a level is in words, packing
coordinates into level arrays, and checking level arrays given raw.

Generated kernels index a tensor's arrays directly and trust them, so everything that
builds a tensor from user data goes through :func:`pack_levels` and everything
supplied raw through :func:`check_levels`. Both are vectorized with numpy because they
run on every operand of every kernel call and tensors reach tens of millions of
entries.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from ucf.errors import FormatError, ShapeError, UnsupportedError
from ucf.format.encoding import held_length
from ucf.format.format import Format
from ucf.format.levels import Checking, Packing, checks
from ucf.format.values import VALUE_DTYPES, value_dtype


def as_shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise ShapeError(f"shape must be a tuple of integers, got {shape!r}") from None
    out = []
    for m, d in enumerate(dims):
        if not isinstance(d, numbers.Integral) or isinstance(d, bool) or int(d) < 0:
            raise ShapeError(f"dimension {m} of shape {dims!r} is not a non-negative integer")
        out.append(int(d))
    return tuple(out)


def foreign_type(obj: Any) -> str:
    """A value's type with its module (``torch.Tensor``), so a foreign class is never
    mistaken for ucf's own of the same name."""
    cls = type(obj)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def describe_level(fmt: Format, level: int) -> str:
    m = fmt.maps[level]
    what = f"mode {m.mode}" if m.plain else f"{m} of mode {m.mode}"
    return f"level {level} ({fmt.levels[level].name}, {what})"


def describe_owner(fmt: Format, above: np.ndarray) -> str:
    """The coordinates ``above`` of the levels over one level, in the user's terms: ``row
    3``, or ``row 3, group 2 (columns 8..11)`` under a block of a matrix's columns."""
    matrix = fmt.order == 2
    parts = []
    for m, c in zip(fmt.maps, above.tolist(), strict=False):
        noun = ("row", "column")[m.mode] if matrix else f"mode {m.mode}"
        if m.plain:
            parts.append(f"{noun} {c}" if matrix else f"index {c} of {noun}")
        elif not m.mod:
            span = f"{c * m.div}..{c * m.div + m.div - 1}"
            parts.append(
                f"group {c} ({noun}s {span})" if matrix else f"group {c} ({span}) of {noun}"
            )
        else:
            parts.append(f"place {c} in a block of {noun}")
    return ", ".join(parts) or "the tensor"


def sort_sum(lc: np.ndarray, vals: np.ndarray, dims: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Sort level-ordered coordinates lexicographically and sum duplicate tuples.

    Whenever the index space fits in 63 bits, one linearized int64 key is
    sorted and the coordinates are decoded from it afterwards: that beats a
    lexsort and avoids a random gather of every coordinate column.  The sort
    is not stable, so duplicates are summed in an unspecified (but
    deterministic) order.
    """
    nnz = len(vals)
    if nnz == 0 or lc.shape[1] == 0:
        return lc, vals
    if math.prod(dims) < 2**63:
        key = lc[:, 0].copy()
        for j in range(1, lc.shape[1]):
            key *= dims[j]
            key += lc[:, j]
        if bool(np.all(key[1:] > key[:-1])):
            return lc, vals
        perm = np.argsort(key)
        key = key[perm]
        vals = vals[perm]
        new = key[1:] != key[:-1]
        if not new.all():
            starts = np.flatnonzero(np.concatenate(([True], new)))
            vals = np.add.reduceat(vals, starts)
            key = key[starts]
        out = np.empty((len(key), lc.shape[1]), dtype=np.int64, order="F")
        for j in range(lc.shape[1] - 1, 0, -1):
            key, out[:, j] = np.divmod(key, dims[j])
        out[:, 0] = key
        return out, vals
    perm = np.lexsort(lc.T[::-1])
    lc = lc[perm]
    vals = vals[perm]
    new = np.any(lc[1:] != lc[:-1], axis=1)
    if not new.all():
        starts = np.flatnonzero(np.concatenate(([True], new)))
        vals = np.add.reduceat(vals, starts)
        lc = lc[starts]
    return lc, vals


def pack_levels(
    shape: tuple[int, ...],
    fmt: Format,
    lc: np.ndarray,
    vals: np.ndarray,
    idt: np.dtype,
    sorted_unique: bool = False,
) -> tuple[list[dict[str, np.ndarray]], np.ndarray]:
    """Level arrays and values from coordinates given in *level* order (nnz, levels).

    Every entry is tracked by its position at the current level; positions
    are non-decreasing in lexicographic order, so a C run's new positions are
    exactly the entries whose (parent, run coordinates) differ from their
    predecessor.
    """
    dims = fmt.level_dims(shape)
    dt = vals.dtype
    if not fmt.levels:
        total = vals.sum(dtype=dt) if len(vals) else dt.type(0)
        return [], np.array([total], dtype=dt)
    if not sorted_unique:
        lc, vals = sort_sum(lc, vals, dims)
    nnz = len(vals)
    for lvl in range(len(fmt.levels)):
        if fmt.levels[lvl].arrays:
            checks.fits(describe_level(fmt, lvl), "dimension", dims[lvl] - 1, idt)
    state = Packing(
        lc,
        dims,
        idt,
        np.zeros(nnz, dtype=np.int64),
        where=lambda lvl: describe_level(fmt, lvl),
        owner=lambda lvl, e: describe_owner(fmt, lc[e, :lvl]),
    )
    levels: list[dict[str, np.ndarray]] = []
    for lvl, kind in enumerate(fmt.levels):
        levels.append(kind.pack(lvl, fmt.run_end(lvl), state))
        checks.fits(describe_level(fmt, lvl), "position count", state.count, idt)
    parent, count = state.parent, state.count
    if nnz == count and (nnz == 0 or (parent[-1] == nnz - 1)):
        out = np.ascontiguousarray(vals)
    else:  # positions of dense levels below sparse ones that no entry reaches
        out = np.full(count, fmt.fill, dtype=dt) if fmt.fill else np.zeros(count, dtype=dt)
        out[parent] = vals
    return levels, out


def coords_array(coords: Any, order: int | None) -> np.ndarray:
    c = np.asarray(coords)
    if c.ndim == 2 and c.size == 0 and (order is None or c.shape[1] == order):
        return np.zeros(c.shape, dtype=np.int64)  # keeps the row count of order-0 input
    if c.size == 0:
        n = order if order is not None else (c.shape[1] if c.ndim == 2 else 0)
        return np.zeros((0, n), dtype=np.int64)
    if c.ndim == 1 and order == 1:
        c = c[:, None]
    if c.ndim != 2 or (order is not None and c.shape[1] != order):
        want = f"(nnz, {order})" if order is not None else "(nnz, order)"
        raise ShapeError(f"coords must have shape {want}, got {c.shape}")
    if c.dtype.kind not in "iu":
        raise FormatError(f"coordinates must be integers, got dtype {c.dtype}")
    return c.astype(np.int64, copy=False)


def check_levels(
    shape: tuple[int, ...], fmt: Format, levels: list[Any], index_dtype: np.dtype
) -> int:
    """Check the level arrays of a tensor of ``shape`` in ``fmt`` against every invariant
    kernels rely on (raising FormatError on the first breach); the number of positions
    of the last level, which the values must fill."""
    idt = index_dtype
    if len(shape) != fmt.order:
        raise FormatError(
            f"format '{fmt}' has {len(fmt.levels)} levels over {fmt.order} modes but "
            f"shape {shape} has {len(shape)} modes"
        )
    if len(levels) != len(fmt.levels):
        raise FormatError(
            f"format '{fmt}' has {len(fmt.levels)} levels but {len(levels)} level "
            "array dicts were given"
        )
    state = Checking()
    dims = fmt.level_dims(shape)
    for lvl, kind in enumerate(fmt.levels):
        where = describe_level(fmt, lvl)
        dim = dims[lvl]
        arrays = levels[lvl]
        if not isinstance(arrays, dict):
            raise FormatError(f"{where}: expected a dict of arrays, got {type(arrays).__name__}")
        extra = sorted(set(arrays) - set(kind.arrays))
        if extra:
            raise FormatError(
                f"{where}: unexpected array(s) {', '.join(map(repr, extra))}; a "
                f"{kind.name} level stores {list(kind.arrays) or 'no arrays'}"
            )
        for name in kind.arrays:
            checks.index_array(where, name, arrays.get(name), idt)
        state.level = lvl
        kind.check(where, arrays, dim, fmt.unique(lvl), state)
    return state.count


def check_values(fmt: Format, vals: Any, count: int) -> None:
    """Check a tensor's values array: one value per position of the last level (``count``)
    in the dtype ``fmt`` states, or held as its values say (raises FormatError)."""
    if not isinstance(vals, np.ndarray):
        raise FormatError(f"vals must be a numpy array, got {type(vals).__name__}")
    if fmt.values is not None and not fmt.values.plain:
        want = held_length(fmt.values, count)
        if vals.dtype != fmt.values.dtype or vals.ndim != 1 or not vals.flags.c_contiguous:
            raise FormatError(
                f"format '{fmt}' holds its values in a contiguous 1-D {fmt.values.dtype} "
                f"array, got {vals.dtype} of shape {vals.shape}"
            )
        if len(vals) != want:
            per = "two positions per byte" if fmt.values.packed else "one per position"
            raise FormatError(
                f"vals has length {len(vals)}, expected {want} ({per} of the last level, "
                f"{count} positions)"
            )
        return
    value_dtype(vals.dtype)
    if vals.dtype not in VALUE_DTYPES:
        raise FormatError(f"vals has non-native byte order {vals.dtype.str}")
    if vals.ndim != 1:
        raise FormatError(f"vals must be 1-D, got shape {vals.shape}")
    if not vals.flags.c_contiguous:
        raise FormatError("vals is not C-contiguous")
    if fmt.values is not None and vals.dtype != fmt.values.dtype:
        raise FormatError(f"format '{fmt}' holds {fmt.values} values but vals is {vals.dtype}")
    if len(vals) != count:
        raise FormatError(
            f"vals has length {len(vals)}, expected one per position of the last level = {count}"
        )


def zero_filled(fmt: Format, layout: str) -> None:
    """Refuse a fill other than 0 where ``layout`` (scipy's, torch's) reads absent
    entries as 0."""
    if fmt.fill:
        raise UnsupportedError(
            f"a tensor in format '{fmt.name}' reads absent entries as {fmt.fill}; "
            f"{layout} reads them as 0: convert it first (t.convert('dense') keeps every value)"
        )
