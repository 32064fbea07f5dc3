"""Kernel operands from anything a user holds: ucf tensors, numpy arrays and scalars,
scipy.sparse, torch tensors and DLPack arrays."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from ucf.errors import FormatError, OperandError, ShapeError, UnsupportedError, boundary
from ucf.format import torch_layouts
from ucf.format.scipy_layouts import from_scipy, is_scipy
from ucf.format.tensor import Tensor, foreign_type, from_dlpack, from_numpy
from ucf.format.values import index_dtype_of


@boundary
def as_tensor(
    obj: Any,
    format: Any = None,
    name: str = "",
    dtype: Any = None,
    index_dtype: Any = None,
) -> Tensor:
    """Coerce a kernel operand into a Tensor, converting only what differs.

    Errors name the operand because the caller passes many of them at once.
    """
    try:
        if isinstance(obj, Tensor):
            return obj.convert(format, index_dtype, dtype)
        if is_scipy(obj):
            t = from_scipy(obj, format, dtype, index_dtype)
            return t
        if isinstance(obj, (np.ndarray, np.generic, numbers.Number, list, tuple)):
            try:
                a = np.asarray(obj)
            except ValueError as e:
                raise OperandError(f"cannot make an array: {e}") from None
            return from_numpy(a, format, dtype, index_dtype_of(index_dtype))
        if torch_layouts.is_torch(obj):
            return torch_layouts.from_torch(obj, format, dtype, index_dtype)
        if hasattr(obj, "__dlpack__"):
            return from_dlpack(obj, format, dtype, index_dtype)
    except (OperandError, FormatError, ShapeError, UnsupportedError) as e:
        if name and f"operand {name}" not in str(e):
            raise type(e)(f"operand {name}: {e}") from None
        raise
    who = f"operand {name}" if name else "operand"
    raise OperandError(
        f"{who}: unsupported type {foreign_type(obj)}; expected a ucf Tensor, "
        "numpy array, scalar, scipy.sparse matrix, torch tensor or DLPack array"
    )
