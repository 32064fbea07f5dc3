"""Tensors in level storage: construction, unpacking, validation and conversion.

Generated kernels index the arrays of a :class:`Tensor` directly and trust
them, so everything that builds a tensor from user data goes through the
packing of ``ucf.format.storage`` and everything supplied raw goes through
:meth:`Tensor.validate`.

Storage contract (relied on by the code generator):

* ``levels[l]`` is ``{}`` for a dense (U) level, ``{"pos", "crd"}`` for a
  compressed (C) level and ``{"crd"}`` for a singleton (S) level; every index
  array is 1-D, C-contiguous and of ``index_dtype``.
* the root has one position; a U level has ``parent_count * d`` positions
  (child of ``p`` at coordinate ``c`` is ``p * d + c``); a C level gives parent
  ``p`` the positions ``pos[p] .. pos[p+1]-1``; an S level has exactly one
  position per parent position.
* ``vals`` holds one value per position of the last level.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ucf.errors import (
    DLPackError,
    FormatError,
    OperandError,
    ShapeError,
    boundary,
)
from ucf.format.arraylike import ArrayLike
from ucf.format.convert import relevel
from ucf.format.encoding import check_scales, decode, encode
from ucf.format.format import Format, parse_format
from ucf.format.levels import checks
from ucf.format.relayout import relaid, relayable
from ucf.format.storage import (
    as_shape,
    check_levels,
    check_values,
    coords_array,
    describe_level,
    foreign_type,
    pack_levels,
)
from ucf.format.values import (
    INDEX_DTYPES,
    VALUES,
    index_dtype_of,
    value_dtype,
)

FormatLike = str | Format

#: Conversions to and from other libraries' arrays, by name: ``to_scipy``,
#: ``from_scipy`` and ``to_torch``. Their modules (``scipy_layouts``,
#: ``torch_layouts``) build tensors with this one, so they register here rather than
#: this module importing them back; ``ucf.format`` imports them, so every entry is in
#: place before a Tensor exists.
INTERCHANGE: dict[str, Callable[..., Any]] = {}


# --------------------------------------------------------------------------- Tensor


class Tensor(ArrayLike):
    """A tensor stored level by level in a :class:`Format`.

    The arrays are public and raw on purpose: kernels read them directly, and
    zero-copy interchange with scipy and numpy depends on holding the very
    buffers the user passed in.
    """

    __slots__ = ("shape", "format", "levels", "vals", "index_dtype", "scales")

    shape: tuple[int, ...]
    format: Format
    levels: list[dict[str, np.ndarray]]
    vals: np.ndarray
    index_dtype: np.dtype
    #: A quantized tensor's scales and zero points (``ucf.format.encoding.Scales``).
    scales: Any

    def __init__(
        self,
        shape: Sequence[int],
        format: FormatLike,
        levels: Sequence[dict[str, np.ndarray]],
        vals: Any,
        index_dtype: Any = None,
        check: bool = True,
        scales: Any = None,
    ) -> None:
        self.shape = as_shape(shape)
        self.scales = scales
        self.format = parse_format(format, order=len(self.shape))
        self.levels = [dict(lv) if isinstance(lv, dict) else lv for lv in levels]
        self.vals = vals if isinstance(vals, np.ndarray) else np.asarray(vals)
        if index_dtype is None:
            found = [
                a.dtype
                for lv in self.levels
                if isinstance(lv, dict)
                for a in lv.values()
                if isinstance(a, np.ndarray)
            ]
            index_dtype = found[0] if found else None
        self.index_dtype = index_dtype_of(index_dtype)
        if check:
            self.validate()

    # ------------------------------------------------------------ properties

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the numbers held: ``vals.dtype``, except for the values numpy
        has no type for and quantized ones (``Values.numbers``: what to_numpy gives)."""
        values = self.format.values
        return self.vals.dtype if values is None or values.plain else values.numbers

    @property
    def plain(self) -> bool:
        """Whether ``vals`` holds the numbers themselves, one per position."""
        return self.format.values is None or self.format.values.plain

    def numbers(self, dtype: Any = np.float32) -> np.ndarray:
        """The number at every stored position: ``vals`` itself when plain, else decoded
        (bfloat16 widened, int4 unpacked, quantized values dequantized in ``dtype``)."""
        if self.plain:
            return self.vals
        values = self.format.values
        count = self.level_sizes()[-1] if self.format.levels else 1
        groups = lambda: self.scale_groups(values.level)  # noqa: E731
        return decode(values, self.vals, count, groups, self.scales, dtype)

    def scale_groups(self, level: int | None) -> np.ndarray:
        """The scale group of every stored position: its ancestor's position at ``level``
        (None: all in group 0)."""
        if level is None:
            return np.zeros(self.level_sizes()[-1] if self.format.levels else 1, np.int64)
        return self.columns(level)[0][level + 1]

    def group_count(self, level: int | None) -> int:
        """The number of scale groups with one per position of ``level`` (None: one)."""
        return 1 if level is None else self.level_sizes()[level]

    @property
    def order(self) -> int:
        return len(self.shape)

    @property
    def ndim(self) -> int:
        """The order under numpy's name, which Dask reads to join chunks."""
        return len(self.shape)

    @property
    def nnz(self) -> int:
        """Stored entries (explicit zeros and U-level fill included)."""
        if self.plain or not self.format.levels:
            return int(len(self.vals))
        return self.level_sizes()[-1]

    @property
    def arrays(self) -> list[np.ndarray]:
        """Every array the tensor holds, the ones a kernel reads: its levels', its values
        and its scales (what aliasing checks and replays compare)."""
        arrays = [a for level in self.levels for a in level.values()]
        arrays.append(self.vals)
        if self.scales is not None:
            arrays += [self.scales.scale, self.scales.zero_point]
        return arrays

    def level_sizes(self) -> list[int]:
        """Number of positions at each level, outermost first."""
        sizes = []
        count = 1
        dims = self.format.level_dims(self.shape)
        for lvl, kind in enumerate(self.format.levels):
            count = kind.size(self.levels[lvl], count, dims[lvl])
            sizes.append(count)
        return sizes

    # ------------------------------------------------------------ validation

    def validate(self) -> None:
        """Check every storage invariant kernels rely on; raise FormatError on the first breach.

        Kernels never bounds-check, so a malformed tensor would read out of
        range instead of failing; this is the single gate in front of them.
        """
        fmt = self.format
        count = check_levels(self.shape, fmt, self.levels, self.index_dtype)
        check_values(fmt, self.vals, count)
        if fmt.values is not None and fmt.values.quantized:
            check_scales(fmt, self.scales, self.group_count(fmt.values.level))

    # ------------------------------------------------------------ constructors

    @classmethod
    def from_coo(
        cls,
        coords: Any,
        values: Any,
        shape: Any = None,
        format: Any = None,
        dtype: Any = None,
        index_dtype: Any = np.int32,
    ) -> Tensor:
        return from_coo(coords, values, shape, format, dtype, index_dtype)

    @classmethod
    def from_numpy(
        cls, arr: Any, format: Any = None, dtype: Any = None, index_dtype: Any = np.int32
    ) -> Tensor:
        return from_numpy(arr, format, dtype, index_dtype)

    @classmethod
    def from_scipy(
        cls, m: Any, format: Any = None, dtype: Any = None, index_dtype: Any = None
    ) -> Tensor:
        return INTERCHANGE["from_scipy"](m, format, dtype, index_dtype)

    @classmethod
    def zeros(
        cls, shape: Any, format: Any = None, dtype: Any = None, index_dtype: Any = np.int32
    ) -> Tensor:
        return zeros(shape, format, dtype, index_dtype)

    # ------------------------------------------------------------ unpacking

    def to_coo(self) -> tuple[np.ndarray, np.ndarray]:
        """Coordinates (nnz, order) in original mode numbering and values of every stored position.

        The values array is the tensor's own ``vals`` (not a copy) when they are plain:
        callers converting between formats should not pay for a copy they discard.
        """
        fmt = self.format
        cols, count = self.columns()
        coords = fmt.mode_coords(cols, count)
        if fmt.blocked:  # the padding of partial blocks lies outside the shape
            inside = np.all(coords < np.asarray(self.shape, dtype=np.int64), axis=1)
            if not inside.all():
                return coords[inside], self.numbers()[inside]
        return coords, self.numbers()

    def columns(self, mark: int | None = None) -> tuple[list[np.ndarray], int]:
        """Every stored position's level coordinates (one column per level) and their
        count; with ``mark``, one more column after level ``mark``'s: each position's
        ancestor there."""
        dims = self.format.level_dims(self.shape)
        cols: list[np.ndarray] = []
        count = 1
        for lvl, kind in enumerate(self.format.levels):
            cols, count = kind.unpack(self.levels[lvl], dims[lvl], cols, count)
            if lvl == mark:
                cols.append(np.arange(count, dtype=np.int64))  # carried down by the levels below
        return cols, count

    def _dense_view(self) -> np.ndarray | None:
        """The vals buffer viewed as the dense array, when the layout allows it."""
        fmt = self.format
        if fmt.is_dense and fmt.mode_order == tuple(range(len(fmt.levels))) and self.plain:
            return self.vals.reshape(self.shape)
        return None

    def to_numpy(self) -> np.ndarray:
        """A fresh dense array; never aliases the tensor so callers may write to it."""
        fmt = self.format
        if fmt.is_dense and not fmt.blocked:
            perm_shape = tuple(fmt.level_dims(self.shape))
            a = self.numbers().reshape(perm_shape).transpose(np.argsort(fmt.mode_order))
            return np.array(a, order="C", copy=True)
        out = np.full(self.shape, fmt.fill, dtype=self.dtype)
        coords, vals = self.to_coo()
        if len(vals):
            out[tuple(coords.T)] = vals
        return out

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        view = self._dense_view() if copy is not True else None
        if view is not None:
            if dtype is None or np.dtype(dtype) == view.dtype:
                return view
            if copy is False:
                raise ValueError("converting the tensor to another dtype requires a copy")
            return view.astype(dtype)
        if copy is False:
            raise ValueError(
                f"a tensor in format '{self.format}' cannot be viewed as a dense array without "
                "a copy"
            )
        a = self.to_numpy()
        return a if dtype is None else a.astype(dtype, copy=False)

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Any = None,
        dl_device: Any = None,
        copy: bool | None = None,
    ) -> Any:
        """Share a dense tensor's values through DLPack (``torch.from_dlpack(t)``,
        ``np.from_dlpack(t)``); other formats raise :class:`DLPackError`, since DLPack
        describes strided arrays only."""
        view = self._dense_view()
        if view is None:
            raise DLPackError(
                f"a tensor in format '{self.format}' has no strided buffer for DLPack; "
                "convert it to a dense format first (t.convert('dense'))"
            )
        # Only the keywords the consumer set: numpy before 2.1 takes ``stream`` alone,
        # and consumers retry without ``max_version`` on the TypeError it raises.
        given = dict(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)
        return view.__dlpack__(**{k: v for k, v in given.items() if v is not None})

    def __dlpack_device__(self) -> tuple[int, int]:
        """Always the CPU (DLPack's device type 1, device 0): ucf keeps tensors in host memory."""
        return (1, 0)

    def to_torch(self) -> Any:
        """The torch tensor of the matching layout, sharing buffers where it can; see
        :func:`ucf.format.torch_layouts.to_torch`."""
        return INTERCHANGE["to_torch"](self if self.plain else self.astype(self.dtype))

    def to_scipy(self, matrix: bool = False) -> Any:
        """A scipy sparse array (``matrix=True``: matrix) sharing buffers where scipy allows;
        see :func:`ucf.format.scipy_layouts.to_scipy`."""
        return INTERCHANGE["to_scipy"](self if self.plain else self.astype(self.dtype), matrix)

    # ------------------------------------------------------------ conversion

    def copy(self) -> Tensor:
        levels = [{k: v.copy() for k, v in lv.items()} for lv in self.levels]
        vals, scales = self.vals.copy(), self.scales
        if scales is not None:
            scales = replace(scales, scale=scales.scale.copy(), zero_point=scales.zero_point.copy())
        return Tensor(self.shape, self.format, levels, vals, self.index_dtype, False, scales)

    def astype(self, dtype: Any) -> Tensor:
        """Cast values only; index arrays are shared since they do not change."""
        dt = value_dtype(dtype)
        if dt == self.dtype and self.plain:
            return self
        levels = [dict(lv) for lv in self.levels]
        if not self.plain:  # the numbers, held plainly
            fmt = self.format.structure
            exact = dt if dt.kind == "f" and dt.itemsize > 4 else np.float32
            return Tensor(
                self.shape, fmt, levels, self.numbers(exact).astype(dt), self.index_dtype, False
            )
        fmt = replace(self.format, values=VALUES[dt.name]) if self.format.values else self.format
        return Tensor(self.shape, fmt, levels, self.vals.astype(dt), self.index_dtype, check=False)

    def convert(
        self,
        format: Any = None,
        index_dtype: Any = None,
        dtype: Any = None,
        *,
        keep_zeros: bool = False,
    ) -> Tensor:
        """Repack in another format, index dtype or value dtype; ``self`` if nothing changes.

        Stored zeros (stored fill values) are dropped when the format changes:
        otherwise converting a dense tensor to a sparse format would store every
        element. ``keep_zeros`` keeps those a sparse tensor stores (as scipy's
        conversions do): a kernel's sparse output keeps every entry it computed in
        any format, so its gradient reads them all (``ucf.autodiff``). The result
        may share arrays with ``self`` where they come out unchanged (CSR to COO
        keeps the column indices and values, as scipy's ``tocoo`` does). Linear in
        the entries (see ``ucf.format.convert``).
        """
        fmt = self.format if format is None else parse_format(format, order=self.order)
        idt = self.index_dtype if index_dtype is None else index_dtype_of(index_dtype)
        if not (self.plain and (fmt.values is None or fmt.values.plain)):
            return self._convert_held(fmt, idt, dtype)
        dt = fmt.stored_dtype(dtype, self.dtype)
        if fmt.structure == self.format.structure:
            out = self.astype(dt)
            if idt == self.index_dtype:
                if out.format == fmt:
                    return out
                return Tensor(self.shape, fmt, out.levels, out.vals, idt, check=False)
            levels = []
            dims = fmt.level_dims(self.shape)
            for lvl, lv in enumerate(out.levels):
                if lv and dims[lvl] - 1 > np.iinfo(idt).max:
                    raise FormatError(
                        f"{describe_level(fmt, lvl)}: dimension {dims[lvl]} does not fit index "
                        f"dtype {idt}; use index_dtype=np.int64"
                    )
                for name, arr in lv.items():
                    if arr.size:
                        checks.fits(describe_level(fmt, lvl), f"{name} value", int(arr.max()), idt)
                levels.append({k: v.astype(idt) for k, v in lv.items()})
            return Tensor(self.shape, fmt, levels, out.vals, idt, check=False)
        if relayable(self.format, fmt):
            vals = relaid(self.numbers(), self.shape, self.format, fmt, dt)
            return Tensor(self.shape, fmt, [{} for _ in fmt.levels], vals, idt, check=False)
        if self.format.is_dense or fmt.fill != self.format.fill:
            # Where the fills differ, every absent entry becomes a value to store.
            return from_numpy(self.to_numpy(), fmt, dt, idt)
        levels, vals = relevel(self, fmt, dt, idt, keep_zeros)
        return Tensor(self.shape, fmt, levels, vals, idt, check=False)

    def _convert_held(self, fmt: Format, idt: np.dtype, dtype: Any) -> Tensor:
        """``convert`` where either side holds values numpy has no type for: through
        the numbers, encoded again. Quantized values keep their scales where the
        groups stay (the same values over the same levels, or one scale per tensor),
        else get fresh ones."""
        if fmt == self.format and idt == self.index_dtype and dtype is None:
            return self
        if fmt.values is None or fmt.values.plain:  # the numbers, in the type asked for
            plain = self.astype(fmt.stored_dtype(dtype, self.dtype)) if not self.plain else self
            return plain.convert(fmt, idt, dtype)
        plain = self.astype(self.dtype) if not self.plain else self
        if dtype is not None:
            raise FormatError(
                f"format '{fmt}' holds {fmt.values} values; dtype={dtype!r} cannot be given"
            )
        kept = fmt.values == self.format.values and self.scales is not None
        kept = kept and (fmt.values.level is None or fmt.structure == self.format.structure)
        scales = (self.scales.scale, self.scales.zero_point) if kept else ()
        return held(plain.convert(fmt.structure, idt), fmt, *scales)


# --------------------------------------------------------------------------- packing


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


def held(
    plain: Tensor, fmt: Format, scale: Any = None, zero_point: Any = None, name: str = ""
) -> Tensor:
    """``plain`` (holding numbers, in ``fmt``'s structure) in ``fmt``'s values: bfloat16
    rounded, int4 packed (integers in -8..7 only), quantized values with the scales
    given, else symmetric ones (``ucf.quantize`` gives them)."""
    fmt = replace(plain.format, values=fmt.values)
    level = fmt.values.level
    vals, scales = encode(
        fmt.values,
        plain.vals,
        lambda: plain.scale_groups(level),
        plain.group_count(level),
        scale,
        zero_point,
        f"tensor {name}: " if name else "",
    )
    return Tensor(plain.shape, fmt, plain.levels, vals, plain.index_dtype, False, scales)


# --------------------------------------------------------------------------- scipy


def trusted(
    shape: tuple[int, ...],
    fmt: Format,
    levels: list[dict[str, np.ndarray]],
    vals: np.ndarray,
    index_dtype: np.dtype = INDEX_DTYPES[0],
) -> Tensor:
    """A Tensor from parts that are already what ``Tensor(..., check=False)`` would make
    of them (a tuple of ints, a Format, a dict per level, numpy arrays, a supported
    index dtype); nothing is normalized or checked. A kernel call wraps each dense
    operand and its output this way, where normalizing cost more than the kernel."""
    t = Tensor.__new__(Tensor)
    t.shape, t.format, t.levels, t.vals, t.index_dtype = shape, fmt, levels, vals, index_dtype
    t.scales = None
    return t
