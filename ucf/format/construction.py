"""Building tensors: user data checked and packed into level storage (``from_coo``,
``from_numpy``, ``from_dlpack``, ``zeros``), and parts already checked wrapped as they
are (``trusted``, the call path's cheap wrap).

Apart from :class:`ucf.format.tensor.Tensor` because these functions build it, not the
other way round: each ends in a Tensor of the packing of ``ucf.format.storage`` (or held
values encoded by ``tensor.held``). The class's constructors ``Tensor.from_coo``,
``Tensor.from_numpy`` and ``Tensor.zeros`` (and ``convert``, which repacks a dense
tensor) reach them through ``tensor.BUILDERS``, where this module registers them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ucf.errors import FormatError, OperandError, ShapeError, boundary
from ucf.format.format import Format, parse_format
from ucf.format.levels import checks
from ucf.format.storage import as_shape, coords_array, foreign_type, pack_levels
from ucf.format.tensor import BUILDERS, Tensor, held
from ucf.format.values import INDEX_DTYPES, index_dtype_of


def pack(
    shape: tuple[int, ...],
    fmt: Format,
    lc: np.ndarray,
    vals: np.ndarray,
    idt: np.dtype,
    sorted_unique: bool = False,
) -> Tensor:
    """A tensor from coordinates given in *level* order (see ``storage.pack_levels``)."""
    levels, out = pack_levels(shape, fmt, lc, vals, idt, sorted_unique)
    return Tensor(shape, fmt, levels, out, idt, check=False)


@boundary
def from_coo(
    coords: Any,
    values: Any,
    shape: Any = None,
    format: Any = None,
    dtype: Any = None,
    index_dtype: Any = np.int32,
) -> Tensor:
    """Pack coordinate/value pairs; duplicates are summed and explicit zeros kept.

    ``coords`` is (nnz, order) in mode numbering, in any order.  ``shape``
    defaults to one past the largest coordinate per mode and ``format`` to
    dense.
    """
    order = len(as_shape(shape)) if shape is not None else None
    c = coords_array(coords, order)
    if shape is None:
        shape = tuple(int(x) + 1 for x in c.max(axis=0)) if len(c) else (0,) * c.shape[1]
    shape = as_shape(shape)
    v = np.asarray(values)
    if v.ndim != 1 or len(v) != len(c):
        if not (v.size == 0 and len(c) == 0):
            raise ShapeError(
                f"values must be 1-D with one entry per coordinate row ({len(c)}), got shape "
                f"{v.shape}"
            )
        v = v.reshape(0)
    fmt = parse_format("dense" if format is None else format, order=len(shape))
    if not plain_values(fmt, dtype):
        return held(from_coo(c, v, shape, fmt.structure, None, index_dtype), fmt)
    dt = fmt.stored_dtype(dtype, np.float64 if v.size == 0 and v.dtype == object else v.dtype)
    # A copy, because packing may hand this buffer to the tensor as its vals.
    v = v.astype(dt, copy=True)
    for m, d in enumerate(shape):
        col = c[:, m]
        if col.size and (int(col.min()) < 0 or int(col.max()) >= d):
            k = checks.first_true((col < 0) | (col >= d))
            assert k is not None
            raise ShapeError(
                f"coordinate {int(col[k])} of mode {m} (entry {k}) is out of range for "
                f"dimension {d}"
            )
    idt = index_dtype_of(index_dtype)
    return pack(shape, fmt, fmt.level_coords(c), v, idt)


@boundary
def from_numpy(
    arr: Any, format: Any = None, dtype: Any = None, index_dtype: Any = np.int32
) -> Tensor:
    """Pack a dense array; sparse (C/S) levels store only its nonzeros (with a fill
    value, the entries that differ from it: ``csr fill=-inf`` stores the finite ones).

    A dense result may share memory with ``arr`` (like ``np.asarray``).
    """
    a = np.asarray(arr)
    fmt = parse_format("dense" if format is None else format, order=a.ndim)
    if not plain_values(fmt, dtype):
        return held(from_numpy(a, fmt.structure, None, index_dtype), fmt)
    dt = fmt.stored_dtype(dtype, a.dtype)
    idt = index_dtype_of(index_dtype)
    if fmt.blocked:
        nz = np.nonzero(a)
        coords = np.stack(nz, axis=1).astype(np.int64, copy=False)
        return pack(a.shape, fmt, fmt.level_coords(coords), a[nz].astype(dt), idt)
    t = np.transpose(a, fmt.mode_order) if fmt.order else a
    if fmt.is_dense:
        vals = np.ascontiguousarray(t, dtype=dt).reshape(-1)
        return Tensor(a.shape, fmt, [{} for _ in range(fmt.order)], vals, idt, check=False)
    nz = np.nonzero(t != fmt.fill) if fmt.fill else np.nonzero(t)
    lc = np.stack(nz, axis=1).astype(np.int64, copy=False)
    return pack(a.shape, fmt, lc, t[nz].astype(dt, copy=False), idt, sorted_unique=True)


@boundary
def from_dlpack(obj: Any, format: Any = None, dtype: Any = None, index_dtype: Any = None) -> Tensor:
    """Pack a dense array from any DLPack exporter on the CPU (torch, numpy, JAX, ...).

    The values are read through ``np.from_dlpack``; a C-contiguous array in a dense
    format with its own dtype is shared, not copied (as :func:`from_numpy` does).
    """
    if not hasattr(obj, "__dlpack__"):
        raise OperandError(f"{foreign_type(obj)} does not export DLPack (no __dlpack__ method)")
    try:
        a = np.from_dlpack(obj)
    except (BufferError, RuntimeError, TypeError, ValueError) as e:
        raise OperandError(f"{foreign_type(obj)} cannot be read through DLPack: {e}") from None
    return from_numpy(a, format, dtype, np.int32 if index_dtype is None else index_dtype)


@boundary
def zeros(shape: Any, format: Any = None, dtype: Any = None, index_dtype: Any = np.int32) -> Tensor:
    """An all-zero tensor: zero-filled for dense levels, no entries for sparse ones. The
    values are float64 unless ``dtype`` or the format's values say otherwise."""
    shape = as_shape(shape)
    fmt = parse_format("dense" if format is None else format, order=len(shape))
    lc = np.zeros((0, len(shape)), dtype=np.int64)
    if not plain_values(fmt, dtype):
        return held(zeros(shape, fmt.structure, None, index_dtype), fmt)
    dt = fmt.stored_dtype(dtype, np.float64)
    return pack(shape, fmt, lc, np.zeros(0, dtype=dt), index_dtype_of(index_dtype))


def plain_values(fmt: Format, dtype: Any) -> bool:
    """Whether ``fmt`` holds plain values; a dtype beside other ones is refused."""
    if fmt.values is None or fmt.values.plain:
        return True
    if dtype is not None:
        raise FormatError(
            f"format '{fmt}' holds {fmt.values} values; dtype={dtype!r} cannot be given"
        )
    return False


def trusted(
    shape: tuple[int, ...],
    fmt: Format,
    levels: list[dict[str, np.ndarray]],
    vals: np.ndarray,
    index_dtype: np.dtype = INDEX_DTYPES[0],
    kind: type[Tensor] = Tensor,
) -> Tensor:
    """A Tensor (of class ``kind``, a subclass that adds no state) from parts that are
    already what ``Tensor(..., check=False)`` would make of them (a tuple of ints, a
    Format, a dict per level, numpy arrays, a supported index dtype); nothing is
    normalized or checked. A kernel call wraps each dense operand and its output this
    way, where normalizing cost more than the kernel."""
    t = kind.__new__(kind)
    t.shape, t.format, t.levels, t.vals, t.index_dtype = shape, fmt, levels, vals, index_dtype
    t.scales = None
    return t


BUILDERS["from_coo"] = from_coo
BUILDERS["from_numpy"] = from_numpy
BUILDERS["zeros"] = zeros
