"""numpy references for affine-index kernels: convolutions and a brute-force affine einsum.

Everything here is plain numpy (no torch, no ucf), so a test's expected value
never comes from the code under test.

* :func:`conv` is a cross-correlation in the deep-learning sense (what
  ``torch.nn.functional.conv{1,2,3}d`` computes) for any number of spatial
  dimensions, channels-first (``NCHW``) or channels-last (``NHWC``), with
  stride, zero padding, dilation and groups.  It is built from
  ``sliding_window_view`` + ``einsum``: padding is ``np.pad``, stride slices
  the window positions, dilation slices inside each window.
* :func:`conv_grouped` is the same with the group as an explicit mode:
  ``O(n,g,m,p,..) = I(n,g,c,p+r,..) * F(g,m,c,r,..)``.
* :func:`submanifold` keeps a "same" convolution only at a mask's points.
* :func:`affine_einsum` evaluates any product of affine accesses by brute
  force over the iteration box, reading out-of-range coordinates as zero.
* :func:`infer_extent` is ucf's extent rule for a variable that only occurs
  inside affine indices (a negative constant offset ``-c`` pads ``c`` zeros on
  both sides), written independently for the references.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = [
    "Access",
    "affine_einsum",
    "affine_einsum_loops",
    "conv",
    "conv_grouped",
    "conv_output_size",
    "infer_extent",
    "submanifold",
]


def _tuple(v, d: int) -> tuple[int, ...]:
    if isinstance(v, int | np.integer):
        return (int(v),) * d
    v = tuple(int(x) for x in v)
    if len(v) != d:
        raise ValueError(f"expected {d} values, got {v}")
    return v


def conv_output_size(n: int, k: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    """torch's output size: ``floor((n + 2*padding - dilation*(k-1) - 1) / stride) + 1``."""
    return (n + 2 * padding - dilation * (k - 1) - 1) // stride + 1


def _windows(x: np.ndarray, ks, stride, padding, dilation) -> np.ndarray:
    """``(N, C, *out, *k)``: every (dilated, strided) window of channels-first ``x``."""
    d = x.ndim - 2
    x = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    span = tuple((k - 1) * dl + 1 for k, dl in zip(ks, dilation, strict=True))
    v = sliding_window_view(x, span, axis=tuple(range(2, 2 + d)))
    sl = (slice(None), slice(None))
    sl += tuple(slice(None, None, s) for s in stride)
    sl += tuple(slice(None, None, dl) for dl in dilation)
    return v[sl]


def conv_grouped(x: np.ndarray, w: np.ndarray, stride=1, padding=0, dilation=1) -> np.ndarray:
    """Grouped convolution with explicit group modes.

    ``x``: ``(N, G, C, *spatial)``, ``w``: ``(G, M, C, *kernel)``;
    returns ``(N, G, M, *out)`` with
    ``O[n,g,m,p..] = sum_{c,r..} x[n,g,c,s*p+dl*r-pad..] * w[g,m,c,r..]``.
    """
    d = x.ndim - 3
    if d < 1 or w.ndim != d + 3:
        raise ValueError(f"x {x.shape} and w {w.shape} do not match")
    stride, padding, dilation = (_tuple(v, d) for v in (stride, padding, dilation))
    n, g, c = x.shape[:3]
    v = _windows(x.reshape(n, g * c, *x.shape[3:]), w.shape[3:], stride, padding, dilation)
    v = v.reshape(n, g, c, *v.shape[2:])
    o = string.ascii_lowercase[8 : 8 + d]  # output positions i, j, k
    k = string.ascii_lowercase[16 : 16 + d]  # window offsets q, r, s
    return np.einsum(f"NGC{o}{k},GMC{k}->NGM{o}", v, w)


def conv(
    x: np.ndarray,
    w: np.ndarray,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
    layout: str = "NCHW",
) -> np.ndarray:
    """Cross-correlation of a batch, as ``torch.nn.functional.conv{d}d`` computes it.

    ``layout="NCHW"`` (channels first): ``x`` is ``(N, C, *spatial)`` and ``w``
    is ``(M, C/groups, *kernel)``; the result is ``(N, M, *out)``.

    ``layout="NHWC"`` (channels last): ``x`` is ``(N, *spatial, C)`` and ``w``
    is ``(*kernel, C/groups, M)``; the result is ``(N, *out, M)``.
    """
    if layout == "NHWC":
        x = np.moveaxis(x, -1, 1)
        w = np.moveaxis(w, (-1, -2), (0, 1))
    elif layout != "NCHW":
        raise ValueError(f"unknown layout {layout!r}")
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    if c != cg * groups or m % groups:
        raise ValueError(f"channels {c} -> {m} do not split into {groups} groups of {cg}")
    xg = x.reshape(n, groups, cg, *x.shape[2:])
    wg = w.reshape(groups, m // groups, cg, *w.shape[2:])
    out = conv_grouped(xg, wg, stride, padding, dilation)
    out = out.reshape(n, m, *out.shape[3:])
    return np.moveaxis(out, 1, -1) if layout == "NHWC" else out


def submanifold(mask: np.ndarray, x: np.ndarray, w: np.ndarray, layout: str = "NHWC") -> np.ndarray:
    """A stride-1 "same" convolution kept only where ``mask`` is nonzero.

    ``mask`` has the output's batch and spatial modes (``(N, *spatial)``); the
    kernel must have odd sizes so that "same" padding is ``(k-1)/2``.
    """
    ks = w.shape[:-2] if layout == "NHWC" else w.shape[2:]
    if any(k % 2 == 0 for k in ks):
        raise ValueError(f"submanifold convolution needs odd kernel sizes, got {ks}")
    out = conv(x, w, padding=tuple((k - 1) // 2 for k in ks), layout=layout)
    keep = np.asarray(mask) != 0
    keep = keep[..., None] if layout == "NHWC" else keep[:, None]
    return np.where(keep, out, 0).astype(out.dtype)


# ----------------------------------------------------------------- affine einsum

#: One affine index: ``({variable: coefficient}, constant)``.
Index = tuple[Mapping[str, int], int]
#: One access: ``(tensor name, [index per mode])``.
Access = tuple[str, Sequence[Index]]


def infer_extent(
    coeffs: Mapping[str, int], const: int, v: str, size: int, known: Mapping[str, int]
) -> int:
    """ucf's extent for ``v`` from one index of a mode of ``size``.

    The index must stay within ``[-pad, size - 1 + pad]`` for every value of
    the other (known) variables, where ``pad = max(0, -const)``.
    """
    c = coeffs[v]
    pad = max(0, -const)
    others = [(a, known[u]) for u, a in coeffs.items() if u != v]
    high = const + sum(a * (n - 1) for a, n in others if a > 0)
    low = const + sum(a * (n - 1) for a, n in others if a < 0)
    if c > 0:
        return (size - 1 + pad - high) // c + 1
    return (low + pad) // (-c) + 1


def affine_einsum(
    out_vars: Sequence[str],
    accesses: Sequence[Access],
    operands: Mapping[str, np.ndarray],
    extents: Mapping[str, int],
) -> np.ndarray:
    """``O(out_vars) = prod(accesses)`` summed over the other variables, by brute force.

    Every variable in ``extents`` ranges over ``range(extents[v])``; reads at
    coordinates outside an operand are zero.  The result has shape
    ``tuple(extents[v] for v in out_vars)``.
    """
    names = list(extents)
    shape = tuple(int(extents[v]) for v in out_vars)
    dtype = np.result_type(*(np.asarray(a).dtype for a in operands.values()))
    out = np.zeros(shape, dtype=dtype)
    if any(int(extents[v]) <= 0 for v in names):
        return out
    grids = np.meshgrid(*(np.arange(extents[v]) for v in names), indexing="ij")
    env = dict(zip(names, grids, strict=True))
    prod = np.ones(grids[0].shape if grids else (), dtype=dtype)
    for tensor, indices in accesses:
        a = np.asarray(operands[tensor])
        inside = np.ones(prod.shape, dtype=bool)
        coords = []
        for mode, (coeffs, const) in enumerate(indices):
            idx = np.full(prod.shape, const, dtype=np.int64)
            for u, c in coeffs.items():
                idx = idx + c * env[u]
            inside &= (idx >= 0) & (idx < a.shape[mode])
            coords.append(np.clip(idx, 0, max(a.shape[mode] - 1, 0)))
        vals = a[tuple(coords)] if a.size else np.zeros(prod.shape, dtype=dtype)
        prod = prod * np.where(inside, vals, 0)
    # sum over the reduction variables, then put the output variables in order
    red = tuple(i for i, v in enumerate(names) if v not in out_vars)
    s = prod.sum(axis=red) if red else prod
    kept = [v for v in names if v in out_vars]
    return np.transpose(s, [kept.index(v) for v in out_vars]).astype(dtype)


def affine_einsum_loops(
    out_vars: Sequence[str],
    accesses: Sequence[Access],
    operands: Mapping[str, np.ndarray],
    extents: Mapping[str, int],
) -> np.ndarray:
    """:func:`affine_einsum` as literal nested Python loops (a cross-check of the reference)."""
    names = list(extents)
    dtype = np.result_type(*(np.asarray(a).dtype for a in operands.values()))
    out = np.zeros(tuple(int(extents[v]) for v in out_vars), dtype=dtype)
    for point in itertools.product(*(range(int(extents[v])) for v in names)):
        env = dict(zip(names, point, strict=True))
        term = 1
        for tensor, indices in accesses:
            a = np.asarray(operands[tensor])
            coord = tuple(const + sum(c * env[u] for u, c in co.items()) for co, const in indices)
            if all(0 <= x < n for x, n in zip(coord, a.shape, strict=True)):
                term = term * a[coord]
            else:
                term = 0
                break
        out[tuple(env[v] for v in out_vars)] += term
    return out
