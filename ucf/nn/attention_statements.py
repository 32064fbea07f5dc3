"""Sparse attention as ucf statements: the scores into the mask's pattern (SDDMM), the
row softmax over the live entries with the ``max`` reduction and ``-inf`` fills, and the
product with the values (SpMM); and the backward pass the same way.

The mask is ``M`` in ``U..Q fill=-inf``: its stored entries (value 0) are the live
elements, everything else reads as ``-inf``, so ``M(i,j) + s * Q·K`` is driven by
``M`` (``-inf`` absorbs the sum) and the scores ``S`` come out in exactly its pattern.
``exp(S - m)`` is 0 where ``S`` is absent, so ``P`` keeps that pattern too, and a
query row with no live key has an empty ``P`` row, ``l = 0`` and an output of
``P·V / max(l, 1) = 0``. (``l >= 1`` wherever a row has a live key: its largest
score contributes ``exp(0) = 1``.) On CUDA, whose kernels write dense outputs only,
``S``, ``P`` and ``dS`` are dense: the same statements visit every element there.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ucf.format.construction import from_numpy
from ucf.format.format import Format
from ucf.format.tensor import Tensor
from ucf.nn.attention_masks import AttentionMask
from ucf.stile.tile_index import build as stile_build

#: The forward statements, in order; ``{m}`` is the mask's indices.
FORWARD = {
    "scores": "S(b,h,i,j) = M({m}) + s * sum(d, Q(b,h,i,d) * K(b,h,j,d))",
    "rowmax": "m(b,h,i) = max(j, S(b,h,i,j))",
    "exp": "P(b,h,i,j) = exp(S(b,h,i,j) - {rowmax})",
    "rowsum": "l(b,h,i) = P(b,h,i,j)",
    "values": "O(b,h,i,e) = P(b,h,i,j) * V(b,h,j,e) / max(l(b,h,i), 1)",
}
#: The backward statements: D is rowsum(dO * O), dS the gradient of the scores.
BACKWARD = {
    "delta": "D(b,h,i) = dO(b,h,i,e) * O(b,h,i,e)",
    "dvalues": "dV(b,h,j,e) = P(b,h,i,j) * dO(b,h,i,e) / max(l(b,h,i), 1)",
    "dscores": (
        "dS(b,h,i,j) = P(b,h,i,j) / max(l(b,h,i), 1) * "
        "(sum(e, dO(b,h,i,e) * V(b,h,j,e)) - D(b,h,i))"
    ),
    "dqueries": "dQ(b,h,i,d) = s * dS(b,h,i,j) * K(b,h,j,d)",
    "dkeys": "dK(b,h,j,d) = s * dS(b,h,i,j) * Q(b,h,i,d)",
}
#: A row max that is never -inf (the dense path's all-masked rows: -inf - -inf is NaN).
_CLAMPED = "max(m(b,h,i), -3.0e38)"


@dataclass(frozen=True)
class Setup:
    """What the statements depend on besides the data."""

    target: str
    emulate: bool
    dtype: str  # "float32" | "float64"
    batch_mask: bool  # the mask has a batch mode (else shared by the batch)
    head_mask: bool

    @property
    def dense(self) -> bool:
        return self.target == "cuda"

    def mask_indices(self) -> str:
        return ",".join([*"b" * self.batch_mask, *"h" * self.head_mask, "i", "j"])

    def statements(self) -> dict[str, tuple[str, dict[str, Format]]]:
        """Each step's statement and the formats of its sparse tensors (none on CUDA
        but the mask's: its scores and weights are dense there)."""
        order = 2 + self.batch_mask + self.head_mask
        formats = {"M": _rows(order, self.dense, -math.inf)}
        if not self.dense:
            formats["S"] = Format.dynamic(4).with_fill(-math.inf)
            formats["P"] = formats["dS"] = Format.dynamic(4)
        rowmax = _CLAMPED if self.dense else "m(b,h,i)"
        text = {**FORWARD, **BACKWARD}
        text["scores"] = text["scores"].format(m=self.mask_indices())
        text["exp"] = text["exp"].format(rowmax=rowmax)
        out: dict[str, tuple[str, dict[str, Format]]] = {}
        for step, stmt in text.items():
            names = {n for n in formats if re.search(rf"\b{n}\(", stmt)}
            out[step] = (stmt, {n: formats[n] for n in names})
        return out


def _rows(order: int, sorted_rows: bool, fill: float) -> Format:
    """CSR of any order reading absent entries as ``fill``: rows sorted where the dense
    path co-iterates them with every element, else as the STile index lists them."""
    fmt = Format.compressed(order, order - 1) if sorted_rows else Format.dynamic(order)
    return fmt.with_fill(fill)


_KERNELS: dict[tuple[Setup, str], Any] = {}


def kernel(setup: Setup, step: str) -> Any:
    """The compiled kernel of one step (once per process and setup)."""
    from ucf import api

    key = (setup, step)
    if key not in _KERNELS:
        stmt, formats = setup.statements()[step]
        _KERNELS[key] = api.compile(
            stmt, formats, target=setup.target, dtype=setup.dtype, emulate=setup.emulate
        )
    return _KERNELS[key]


def mask_tensor(amask: AttentionMask, setup: Setup) -> Tensor:
    """The mask as ``M``: the STile index of its live elements (tiles of 1 x 1), every
    stored value 0, absent entries -inf; its shared batch or head mode dropped. The
    dense path (CUDA) co-iterates it with every element, so its rows are sorted."""
    elements = np.ascontiguousarray(amask.dense())
    if setup.batch_mask and elements.shape[0] == 1:
        elements = np.repeat(elements, amask.shape[0], axis=0)
    keep = [setup.batch_mask, setup.head_mask]
    elements = elements.reshape(
        *(n for n, k in zip(elements.shape[:2], keep, strict=True) if k), *elements.shape[2:]
    )
    fmt = _rows(elements.ndim, setup.dense, -math.inf)
    if setup.dense:
        return from_numpy(np.where(elements, 0.0, -np.inf), fmt, setup.dtype)
    index = stile_build(elements.view(np.uint8), (1,) * elements.ndim)
    zeros = np.zeros(index.nnz, setup.dtype)
    return Tensor(index.shape, fmt, index.levels, zeros, index.index_dtype, False)


@dataclass
class Saved:
    """What the forward pass keeps for the backward one."""

    S: Tensor
    P: Tensor
    l: np.ndarray
    O: np.ndarray


def forward(setup: Setup, q, k, v, M: Tensor, scale: float) -> tuple[np.ndarray, Saved]:
    """O = softmax(Q·K^T·scale on the mask)·V, per batch and head (``q``, ``k``, ``v``
    numpy arrays (B, H, S, D))."""
    S = kernel(setup, "scores")(M=M, s=scale, Q=q, K=k)
    m = kernel(setup, "rowmax")(S=S)
    P = kernel(setup, "exp")(S=S, m=m)
    l_ = kernel(setup, "rowsum")(P=P)
    O = kernel(setup, "values")(P=P, V=v, l=l_)
    out = np.asarray(O)
    return out, Saved(S, P, np.asarray(l_), out)


def backward(setup: Setup, saved: Saved, q, k, v, dO, scale: float):
    """The gradients of ``forward``'s inputs given the output's (numpy arrays)."""
    D = kernel(setup, "delta")(dO=dO, O=saved.O)
    dV = kernel(setup, "dvalues")(P=saved.P, dO=dO, l=saved.l)
    dS = kernel(setup, "dscores")(P=saved.P, l=saved.l, dO=dO, V=v, D=D)
    dQ = kernel(setup, "dqueries")(s=scale, dS=dS, K=k)
    dK = kernel(setup, "dkeys")(s=scale, dS=dS, Q=q)
    return np.asarray(dQ), np.asarray(dK), np.asarray(dV)
