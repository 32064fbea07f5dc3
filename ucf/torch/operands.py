"""Torch tensors as a kernel's operands, and gradients back in each operand's layout.

A strided tensor is read in the format the call gives it (dense by default, so
its values are shared); a strided tensor given a sparse format is read in that
format, so its pattern is its nonzeros. A sparse tensor (CSR, CSC, BSR, COO) is
read in its own layout's format, sharing its arrays, or converted to the format
the call gives it. A dynamic operand is read dense, with a mask. Gradients come
back as the operand came: a strided operand gets a strided gradient (zero off
its pattern when it was read sparse, or off its live tiles when dynamic), a
sparse one a tensor of its layout on its own index arrays, with new values.

A sparse output's gradient, as torch hands it back (sparse of any pattern, or
strided), is taken at the output's stored positions only (``output_gradient``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ucf.autodiff.backward import on_pattern
from ucf.errors import OperandError
from ucf.format.construction import trusted
from ucf.format.format import Format
from ucf.format.storage import foreign_type
from ucf.format.tensor import Tensor
from ucf.format.torch_layouts import from_torch


@dataclass
class Operand:
    """One operand of a call: the user's tensor and what the kernel reads."""

    name: str
    given: Any  # the torch tensor passed (or the values of a pattern: see ``values``)
    read: Any  # a ucf Tensor, or for a dynamic operand its dense numpy array
    own: Tensor | None = None  # a sparse tensor in its own layout's format (its pattern)
    values: bool = False  # ``given`` holds the values of ``own``'s pattern

    @property
    def strided(self) -> bool:
        return not self.values and self.given.layout == _torch().strided


def _torch() -> Any:
    import torch

    return torch


def read_as(t: Any) -> np.dtype:
    """The dtype ucf reads a torch tensor's values in: its own, bfloat16 as float32
    (numpy has no bfloat16; float32 holds each one exactly)."""
    name = str(t.dtype).removeprefix("torch.")
    return np.dtype(np.float32 if name == "bfloat16" else name)


def index_dtype(tensors: dict[str, Any]) -> np.dtype:
    """int64 when a sparse torch operand has int64 indices (torch's default), so that
    its arrays are read in place; else int32."""
    torch = _torch()
    for t in tensors.values():
        if isinstance(t, torch.Tensor) and t.layout != torch.strided:
            idx = t.crow_indices() if t.layout in (torch.sparse_csr, torch.sparse_bsr) else None
            if t.layout == torch.sparse_csc:
                idx = t.ccol_indices()
            if idx is None or idx.dtype == torch.int64:
                return np.dtype(np.int64)
    return np.dtype(np.int32)


def read(
    name: str, t: Any, fmt: Format | None, dynamic: bool, dtype: np.dtype, idx: np.dtype
) -> Operand:
    """``t`` as the kernel reads it, in ``dtype`` values."""
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        raise OperandError(f"operand {name} is a {foreign_type(t)}; ucf.torch takes torch tensors")
    if t.device.type != "cpu":
        raise OperandError(f"operand {name} is on {t.device}; ucf reads CPU memory: pass .cpu()")
    if dynamic:
        if t.layout != torch.strided:
            raise OperandError(
                f"dynamic operand {name} is passed dense, with masks= for its sparsity, "
                f"not as a {str(t.layout).removeprefix('torch.')} tensor"
            )
        a = t.detach().numpy()
        return Operand(name, t, np.ascontiguousarray(a, dtype=dtype))
    if t.layout == torch.strided:
        return Operand(name, t, from_torch(t, format=fmt, dtype=dtype, index_dtype=idx))
    own = from_torch(t, dtype=dtype)
    kernel = own if fmt is None or fmt.structure == own.format.structure else own.convert(fmt)
    return Operand(name, t, kernel, own)


def read_values(name: str, pattern: Tensor, values: Any, dtype: np.dtype) -> Operand:
    """A sparse operand given as a pattern (a ucf Tensor whose index arrays are kept) and
    a torch tensor of its values: the gradient is a tensor of values too."""
    vals = np.ascontiguousarray(values.detach().numpy().reshape(-1), dtype=dtype)
    if len(vals) != len(pattern.vals):
        raise OperandError(
            f"operand {name} has {len(vals)} values but its pattern stores {len(pattern.vals)}"
        )
    t = trusted(pattern.shape, pattern.format, pattern.levels, vals, pattern.index_dtype)
    return Operand(name, values, t, t, values=True)


def output_gradient(grad: Any, output: Tensor, dtype: np.dtype) -> Tensor:
    """The gradient torch hands back for the sparse result ``output``, on ``output``'s
    index arrays: a strided one read at its stored positions (no copy of the whole
    array: torch's gradient of a sum is a broadcast view), a sparse one's entries there
    (zero where it stores none; what it stores elsewhere multiplies a structural zero
    of the output, so it is dropped)."""
    torch = _torch()
    g = grad.detach()
    if g.layout == torch.strided:
        cols, count = output.columns()
        coords = output.format.mode_coords(cols, count)
        vals = np.asarray(g.numpy()[tuple(coords.T)], dtype=dtype)
    else:
        if g.layout == torch.sparse_coo:
            g = g.coalesce()
        found = from_torch(g, dtype=dtype, index_dtype=output.index_dtype)
        vals = on_pattern(output, found, drop_outside=True)
    return trusted(output.shape, output.format, output.levels, vals, output.index_dtype)


def gradient(op: Operand, g: Tensor) -> Any:
    """The gradient ``g`` (a ucf Tensor: dense, or on the kernel's operand's index
    arrays) as a torch tensor of the operand's layout and dtype."""
    torch = _torch()
    dtype = op.given.dtype
    if op.values:
        vals = on_pattern(op.own, g) if g.levels is not op.own.levels else g.vals
        return torch.from_numpy(np.asarray(vals)).reshape(op.given.shape).to(dtype)
    if op.strided:
        dense = np.asarray(g) if g.format.is_dense else g.to_numpy()
        return torch.from_numpy(np.ascontiguousarray(dense)).reshape(op.given.shape).to(dtype)
    own = op.own
    vals = g.vals if op.read is own else on_pattern(own, g)
    vals = vals.astype(str(dtype).removeprefix("torch."), copy=False)
    return trusted(own.shape, own.format, own.levels, vals, own.index_dtype).to_torch()
