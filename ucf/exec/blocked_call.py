"""Calling a kernel over blocked formats: the user's tensors seen in the split shapes
of the kernel's statement (see ``ucf.cin.blocking``), and the output seen back.

The operands are split by ``ucf.cin.split_operands``; the output is joined back
here, in the user's shape and format.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ucf.cin.blocking import Blocking
from ucf.cin.split_operands import same_levels, split_operand, split_operands
from ucf.errors import OperandError
from ucf.format.construction import from_coo, trusted
from ucf.format.format import Format
from ucf.format.tensor import Tensor


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
    split = split_operands(b, given, dtype)
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
        # A view of the user's array when the blocks divide its extents: the kernel then
        # writes the result in place (a copy in and out cost more than an SpMM at 90%).
        # An output no block splits (a scalar) is the user's array itself.
        if any(b.modes[name]):
            whole = Tensor.from_numpy(np.ascontiguousarray(dense))
            out = np.asarray(split_operand(b, name, whole, dtype))
        else:  # (np.ascontiguousarray would make a 0-d array 1-d)
            out = dense if dense.flags.c_contiguous else np.ascontiguousarray(dense)
    result = call(split, b.split_extents(extents), out)
    joined = _join(b, name, result, shape)
    if target is None:
        return joined
    if isinstance(target, Tensor):
        target.vals[:] = joined.convert(target.format).vals
        return target
    if not np.may_share_memory(out, target):  # a padded split is new memory: copy back
        target[...] = joined.to_numpy()
    return joined


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
        # result, with no copy (nor the checks of from_numpy, which cost more than a small
        # kernel's run).
        vals = np.ascontiguousarray(arr).reshape(-1)
        return trusted(shape, Format.dense(len(shape)), [{} for _ in shape], vals)
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
