"""The user's tensors in the split shapes of a blocked kernel's statement (see
``ucf.cin.blocking``): what a call passes the kernel, and what ``static=`` operands
are specialized to when compiling. The split tensors are built from parts known
to be sound (``trusted``): normalizing them again cost more than a small kernel.

A blocked tensor's arrays are already those of the split tensor, so it is passed
as it is. A dense tensor is reshaped, without a copy when the block sizes divide
its extents and padded with zeros when they do not. A plain sparse tensor over a
blocked variable is re-packed from its coordinates.
"""

from __future__ import annotations

import numpy as np

from ucf.cin.blocking import Blocking
from ucf.errors import ConversionWarning, warn_user
from ucf.format.construction import from_coo, trusted
from ucf.format.format import Format
from ucf.format.quantize import split_held
from ucf.format.tensor import Tensor


def split_operands(b: Blocking, given: dict[str, Tensor], dtype: np.dtype) -> dict[str, Tensor]:
    """The split statement's operands: each view of each tensor in ``given`` (the
    user's, by name) cut in its own split, for a kernel computing in ``dtype``."""
    return {
        view: split_operand(b, view, given[tensor], dtype)
        for view, tensor in b.sources.items()
        if tensor in given
    }


def split_operand(b: Blocking, name: str, t: Tensor, dtype: np.dtype) -> Tensor:
    """``t``, the user's tensor that the view ``name`` reads, in the view's split shape,
    for a kernel computing in ``dtype``."""
    blocks = b.modes[name]
    if not any(blocks):
        return t
    fmt = b.user_formats[name]
    shape = b.split_shape(name, t.shape)
    if fmt.blocked and same_levels(b, name):
        if t.format != fmt:
            warn_user(
                f"ucf: operand {b.sources[name]} is stored as '{t.format.name}' but the kernel "
                f"reads '{fmt.name}'; it is converted on every call (convert it once "
                "beforehand, e.g. with ucf.from_numpy(..., format=...) or .convert(...))",
                ConversionWarning,
            )
            t = t.convert(fmt)
        split = trusted(
            shape, b.formats[name], [dict(lv) for lv in t.levels], t.vals, t.index_dtype
        )
        split.scales = t.scales
        return split
    if not t.plain and b.formats[name].values is None:
        # Read dequantized, each number the product of its integer and scale in the
        # kernel's precision, as the kernel computes it from the quantized values of its
        # other reads of t: a float32 copy rounded what a float64 kernel holds exactly
        # (fuzz seeds 114 and 115).
        exact = dtype if dtype == np.float64 else t.dtype
        return split_operand(b, name, t.astype(exact), dtype)
    if not t.plain:  # its numbers split, held again as they were
        split = split_operand(b, name, t.astype(t.dtype), dtype)
        return split_held(t, b.formats[name], split, name)
    if t.format.is_dense:
        pad = [(0, -n % blk if blk else 0) for n, blk in zip(t.shape, blocks, strict=True)]
        dense = np.asarray(t)  # a view of a row-major tensor's values, else a copy
        if any(after for _, after in pad):
            dense = np.pad(dense, pad)
        vals = np.ascontiguousarray(dense, dtype=t.dtype).reshape(-1)
        return trusted(shape, Format.dense(len(shape)), [{} for _ in shape], vals)
    tensor = b.sources[name]
    if t.format.blocked:
        why = (
            f"is read in blocks of {' x '.join(str(n or 1) for n in blocks)}, not its own"
            " (the first access that stores a variable in blocks sets them)"
        )
        fix = "store it in those blocks, or plain,"
    else:
        why = "is indexed by a variable another tensor stores in blocks"
        fix = "store it in the same blocks"
    warn_user(
        f"ucf: operand {tensor} ('{t.format}') {why}, so it is re-packed into those "
        f"blocks on every call ({fix} to avoid the cost)",
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
