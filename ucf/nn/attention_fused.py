"""Calling the fused attention kernels on the CPU targets (``ucf.lower.attention_forward``
and ``attention_backward``).

The kernels are LLIR functions built outside the pipeline, as the STile index is, and
compiled once per process (and kept in the disk cache) per element type, tile shape
and target. Every call binds the torch tensors' memory in place: nothing is copied
but what is not contiguous.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from ucf.lower import work
from ucf.lower.attention_backward import backward_function
from ucf.lower.attention_forward import forward_function
from ucf.nn.attention_masks import AttentionMask
from ucf.stile.index_kernel import compiled_function

_ELEM = {"float32": "f32", "float64": "f64"}


@cache
def _forward(target: str, dtype: str, gq: int, gk: int, threshold: int) -> tuple[Any, Any]:
    return compiled_function(target, forward_function(_ELEM[dtype], gq, gk, threshold))


@cache
def _backward(target: str, dtype: str, gq: int, gk: int, threshold: int) -> tuple[Any, Any]:
    return compiled_function(target, backward_function(_ELEM[dtype], gq, gk, threshold))


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


@dataclass
class Saved:
    """What the forward kernel leaves for the backward one: each row's max and sum."""

    amask: AttentionMask
    out: np.ndarray
    row_max: np.ndarray
    row_sum: np.ndarray


def _common(amask: AttentionMask, q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float):
    """The arguments both kernels start with (see ``ucf.lower.attention_tiles.Shape``)."""
    b, h, sq, d = q.shape
    sk, dv = k.shape[2], v.shape[3]
    bm, hm = amask.broadcast
    tiles = amask.tiles
    pos, crd = tiles.levels[-1]["pos"], tiles.levels[-1]["crd"]
    assert pos.dtype == np.int32 and crd.dtype == np.int32
    elements = amask.elements if amask.elements is not None else np.zeros(1, np.uint8)
    lq, lk = amask.valid(b)
    keep = (q, k, v, pos, crd, elements, lq, lk)
    args = [
        *(_ptr(a) for a in keep),
        b,
        h,
        sq,
        sk,
        d,
        dv,
        int(bm > 1),
        int(hm > 1),
        hm,
        int(amask.elements is not None),
        scale,
    ]
    return args, keep


def forward(target: str, q: np.ndarray, k: np.ndarray, v: np.ndarray, amask: AttentionMask, scale):
    """The output and what the backward pass needs."""
    dtype = q.dtype.name
    gq, gk = amask.granularity
    call, _ = _forward(target, dtype, gq, gk, work.threshold())
    b, h, sq, _ = q.shape
    out = np.empty((b, h, sq, v.shape[3]), dtype)
    row_max = np.empty((b, h, sq), dtype)
    row_sum = np.empty((b, h, sq), dtype)
    args, keep = _common(amask, q, k, v, scale)
    call(*args, _ptr(out), _ptr(row_max), _ptr(row_sum))
    del keep
    return out, Saved(amask, out, row_max, row_sum)


def backward(target: str, saved: Saved, q, k, v, dO: np.ndarray, scale):
    """The gradients of q, k and v."""
    dtype = q.dtype.name
    gq, gk = saved.amask.granularity
    call, _ = _backward(target, dtype, gq, gk, work.threshold())
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    args, keep = _common(saved.amask, q, k, v, scale)
    arrays = (saved.out, dO, saved.row_max, saved.row_sum, dq, dk, dv)
    call(*args, *(_ptr(a) for a in arrays))
    del keep
    return dq, dk, dv
