"""Calling a kernel over blocked formats: the user's tensors seen in the split shapes
of the kernel's statement (see ``ucf.cin.blocking``), and the output seen back.

A blocked tensor's arrays are already those of the split tensor, so it is passed
as it is. A dense tensor is reshaped, without a copy when the block sizes divide
its extents and padded with zeros when they do not. A plain sparse tensor over a
blocked variable is re-packed from its coordinates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ucf.cin.blocking import Blocking
from ucf.errors import ConversionWarning, OperandError, warn_user
from ucf.format.format import Format, dense_format
from ucf.format.quantize import split_held
from ucf.format.tensor import Tensor, from_coo


def run(
    call: Callable[[dict[str, Tensor], dict[str, int], Any], Tensor],
    plan: Any,
    given: dict[str, Tensor],
    extents: dict[str, int],
    out: Any,
    dtype: np.dtype,
) -> Tensor:
    """``call`` (the kernel's own run) on the split operands, output joined back."""
    b: Blocking = plan.blocking
    split = {n: _split(b, n, t) for n, t in given.items()}
    name = plan.statement.lhs.tensor
    shape = tuple(extents[idx.single_variable] for idx in plan.statement.lhs.indices)
    target = None
    if out is not None:
        target = out if isinstance(out, Tensor) else np.asarray(out)
        if not (target.dtype == dtype and b.user_formats[name].is_dense):
            raise OperandError(
                f"out must be a dense {dtype} array or ucf.Tensor for the blocked kernel "
                f"{plan.statement}"
            )
        dense = target.to_numpy() if isinstance(target, Tensor) else target
        out = _split(b, name, Tensor.from_numpy(np.ascontiguousarray(dense))).to_numpy()
    result = call(split, b.split_extents(extents), out)
    joined = _join(b, name, result, shape)
    if target is None:
        return joined
    if isinstance(target, Tensor):
        target.vals[:] = joined.convert(target.format).vals
        return target
    target[...] = joined.to_numpy()
    return joined


def _split(b: Blocking, name: str, t: Tensor) -> Tensor:
    blocks = b.modes[name]
    if not any(blocks):
        return t
    fmt = b.user_formats[name]
    shape = b.split_shape(name, t.shape)
    if fmt.blocked and same_levels(b, name):
        if t.format != fmt:
            warn_user(
                f"ucf: operand {name} is stored as '{t.format}' but the kernel reads the "
                f"blocked format '{fmt}'; it is converted on every call (convert it once "
                "beforehand, e.g. with ucf.from_numpy(..., format=...) or .convert(...))",
                ConversionWarning,
            )
            t = t.convert(fmt)
        levels = [dict(level) for level in t.levels]
        return Tensor(
            shape, b.formats[name], levels, t.vals, t.index_dtype, check=False, scales=t.scales
        )
    if not t.plain:  # its numbers split, held again as they were
        return split_held(t, b.formats[name], _split(b, name, t.astype(t.dtype)), name)
    if t.format.is_dense:
        pad = [(0, -n % blk if blk else 0) for n, blk in zip(t.shape, blocks, strict=True)]
        dense = np.asarray(t)  # a view of a row-major tensor's values, else a copy
        if any(after for _, after in pad):
            dense = np.pad(dense, pad)
        return Tensor.from_numpy(dense.reshape(shape), dtype=t.dtype)
    warn_user(
        f"ucf: operand {name} ('{t.format}') is indexed by a variable another tensor stores "
        "in blocks, so it is re-packed into those blocks on every call (store it in the "
        "same blocks to avoid the cost)",
        ConversionWarning,
    )
    coords, vals = t.to_coo()
    return from_coo(
        _split_coords(coords, blocks),
        vals,
        shape=shape,
        format=b.formats[name].structure,  # the values: as t holds them (see split_held)
        dtype=t.dtype,
        index_dtype=t.index_dtype,
    )


def same_levels(b: Blocking, name: str) -> bool:
    """Whether ``name``'s arrays serve the split statement as they are: its blocked
    format has no plain level over a variable that another tensor stores in blocks."""
    return len(b.formats[name].levels) == len(b.user_formats[name].levels)


def _split_coords(coords: np.ndarray, blocks: tuple[int, ...]) -> np.ndarray:
    cols = []
    for m, blk in enumerate(blocks):
        c = coords[:, m]
        cols += [c // blk, c % blk] if blk else [c]
    return np.stack(cols, axis=1) if cols else coords


def _join(b: Blocking, name: str, t: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The split output ``t`` in the user's shape and format: padding cut away (and any
    values the kernel left there dropped)."""
    fmt: Format = b.user_formats[name]
    blocks = b.modes[name]
    if not any(blocks):
        return t
    exact = all(not blk or n % blk == 0 for n, blk in zip(shape, blocks, strict=True))
    if fmt.blocked and exact and same_levels(b, name):
        return Tensor(shape, fmt, t.levels, t.vals, index_dtype=t.index_dtype, check=False)
    if fmt.is_dense and not fmt.blocked:
        whole = [-(-n // blk) * blk if blk else n for n, blk in zip(shape, blocks, strict=True)]
        arr = np.asarray(t).reshape(whole)[tuple(slice(0, n) for n in shape)]
        # Blocks that divide the extents leave nothing to cut: the kernel's buffer is the
        # result, with no copy.
        return Tensor.from_numpy(np.ascontiguousarray(arr), format=dense_format(len(shape)))
    coords, vals = t.to_coo()
    joined = np.zeros((len(coords), len(shape)), dtype=np.int64)
    col = 0
    for m, blk in enumerate(blocks):
        if blk:
            joined[:, m] = coords[:, col] * blk + coords[:, col + 1]
            col += 2
        else:
            joined[:, m] = coords[:, col]
            col += 1
    inside = np.all(joined < np.asarray(shape, dtype=np.int64), axis=1)
    return from_coo(
        joined[inside],
        vals[inside],
        shape=shape,
        format=fmt,
        dtype=t.dtype,
        index_dtype=t.index_dtype,
    )
