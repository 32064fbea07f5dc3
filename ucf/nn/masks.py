"""What a layer's mask and format are: the format ``ucf.Policy`` finds for a mask, the
entries a format can store of a weight, and a mask given at its tile granularity."""

from __future__ import annotations

from typing import Any

import numpy as np

from ucf.errors import OperandError
from ucf.format.format import Format


def choose_format(mask: np.ndarray, policy: Any = None) -> Format:
    """The cheapest format, by ``policy``'s costs per block (``ucf.Policy`` with its
    default costs if None), among those storing ``mask`` exactly: blocks of a shape whose
    every block is wholly kept or wholly pruned, else single entries (CSR)."""
    if policy is None:
        from ucf.tesa.policy import Policy

        policy = Policy(blocks=DEFAULT_COSTS)
    best, cost = Format.compressed(2, 1), float(mask.sum()) * policy.blocks.get((1, 1), 1.0)
    for (bh, bw), per_block in policy.blocks.items():
        if (bh, bw) == (1, 1) or mask.shape[0] % bh or mask.shape[1] % bw:
            continue
        tiles = mask.reshape(mask.shape[0] // bh, bh, mask.shape[1] // bw, bw)
        some, every = tiles.any(axis=(1, 3)), tiles.all(axis=(1, 3))
        if np.array_equal(some, every) and float(some.sum()) * per_block < cost:
            best, cost = Format.blocked_rows(bh, bw), float(some.sum()) * per_block
    return best


#: Costs per block when no policy is given: a block is cheaper per entry than single
#: entries, as ucf's blocked kernels are (``Policy(blocks="measure")`` measures them).
DEFAULT_COSTS = {(1, 1): 1.0, (4, 4): 8.0, (32, 32): 256.0, (32, 64): 480.0}


def storable(dense: np.ndarray, fmt: Format) -> np.ndarray:
    """The entries of ``dense`` that ``fmt`` keeps when it stores it: N:M its ``n``
    largest in magnitude per group of ``m`` along a row, any other format all of them."""
    width = next((k.segment_width for k in fmt.levels if k.segment_width), None)
    if width is None:
        return np.ones(dense.shape, dtype=bool)
    group = fmt.maps[-1].mod
    rows, cols = dense.shape
    if cols % group:
        raise OperandError(f"{cols} columns do not split into groups of {group} for '{fmt}'")
    mag = np.abs(dense).reshape(rows, cols // group, group)
    order = np.argsort(-mag, axis=2, kind="stable")
    keep = np.zeros_like(mag, dtype=bool)
    np.put_along_axis(keep, order[..., :width], True, axis=2)
    return keep.reshape(rows, cols)


def element_mask(m: Any, shape: tuple[int, int], tile: tuple[int, int]) -> Any:
    """A mask of the weight's ``shape`` (booleans) from one of that shape or of its grid
    of ``tile``-sized tiles (each tile's entry spread over the tile)."""
    import torch

    t = m if isinstance(m, torch.Tensor) else torch.as_tensor(np.asarray(m))
    t = t.detach() != 0 if t.dtype != torch.bool else t.detach()
    grid = (-(-shape[0] // tile[0]), -(-shape[1] // tile[1]))
    if tuple(t.shape) == shape:
        return t
    if tuple(t.shape) == grid:
        full = t.repeat_interleave(tile[0], 0).repeat_interleave(tile[1], 1)
        return full[: shape[0], : shape[1]].contiguous()
    raise OperandError(
        f"a mask has the weight's shape {shape} or its grid of {tile[0]}x{tile[1]} tiles "
        f"{grid}; got {tuple(t.shape)}"
    )
