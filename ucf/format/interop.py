"""Kernel operands from anything a user holds: ucf tensors, numpy arrays and scalars,
scipy.sparse, torch tensors and DLPack arrays."""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

import numpy as np

from ucf.errors import FormatError, OperandError, ShapeError, UnsupportedError, boundary
from ucf.format import torch_layouts
from ucf.format.construction import from_dlpack, from_numpy
from ucf.format.scipy_layouts import from_scipy, has_scipy_layout, is_scipy
from ucf.format.storage import foreign_type
from ucf.format.tensor import Tensor
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


def like_operands(result: Tensor, operands: Iterable[Any]) -> Any:
    """``result`` in the kind of array the caller passed, as opt_einsum returns it:
    a torch tensor when any operand is one; else a numpy array for a dense result
    (a numpy scalar for order 0, as ``np.einsum`` gives), and a scipy sparse array
    (a matrix, when an operand was a scipy matrix) for a sparse result that scipy
    stores alike; any other sparse result stays a ``ucf.Tensor``."""
    operands = list(operands)
    if any(torch_layouts.is_torch(v) for v in operands):
        return result.to_torch()
    if result.format.is_dense:
        dense = np.asarray(result)
        return dense[()] if dense.ndim == 0 else dense
    if has_scipy_layout(result):
        import scipy.sparse as sp

        return result.to_scipy(matrix=any(isinstance(v, sp.spmatrix) for v in operands))
    return result
