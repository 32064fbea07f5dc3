"""Tensors in level storage: the class, its validation and its conversions.

Generated kernels index the arrays of a :class:`Tensor` directly and trust
them, so everything that builds a tensor from user data goes through the
packing of ``ucf.format.storage`` (the functions of ``ucf.format.construction``)
and everything supplied raw goes through :meth:`Tensor.validate`. Reading the
entries back out is ``ucf.format.unpacking``'s, mixed into the class.

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

from ucf.errors import FormatError
from ucf.format.arraylike import ArrayLike
from ucf.format.convert import relevel
from ucf.format.encoding import check_scales, encode
from ucf.format.format import Format, parse_format
from ucf.format.levels import checks
from ucf.format.relayout import relaid, relayable
from ucf.format.storage import as_shape, check_levels, check_values, describe_level
from ucf.format.unpacking import Unpacking
from ucf.format.values import VALUES, index_dtype_of, value_dtype

FormatLike = str | Format

#: The functions the constructors and conversions below hand their work to, by name:
#: ``from_coo``, ``from_numpy`` and ``zeros`` (``ucf.format.construction``), ``to_scipy``
#: and ``from_scipy`` (``scipy_layouts``) and ``to_torch`` (``torch_layouts``). Their
#: modules build tensors with this one, so they register here rather than this module
#: importing them back; ``ucf.format`` imports them, so every entry is in place before a
#: Tensor exists.
BUILDERS: dict[str, Callable[..., Any]] = {}


# --------------------------------------------------------------------------- Tensor


class Tensor(Unpacking, ArrayLike):
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
        return BUILDERS["from_coo"](coords, values, shape, format, dtype, index_dtype)

    @classmethod
    def from_numpy(
        cls, arr: Any, format: Any = None, dtype: Any = None, index_dtype: Any = np.int32
    ) -> Tensor:
        return BUILDERS["from_numpy"](arr, format, dtype, index_dtype)

    @classmethod
    def from_scipy(
        cls, m: Any, format: Any = None, dtype: Any = None, index_dtype: Any = None
    ) -> Tensor:
        return BUILDERS["from_scipy"](m, format, dtype, index_dtype)

    @classmethod
    def zeros(
        cls, shape: Any, format: Any = None, dtype: Any = None, index_dtype: Any = np.int32
    ) -> Tensor:
        return BUILDERS["zeros"](shape, format, dtype, index_dtype)

    # ------------------------------------------------------------ other libraries

    def to_torch(self) -> Any:
        """The torch tensor of the matching layout, sharing buffers where it can; see
        :func:`ucf.format.torch_layouts.to_torch`."""
        return BUILDERS["to_torch"](self if self.plain else self.astype(self.dtype))

    def to_scipy(self, matrix: bool = False) -> Any:
        """A scipy sparse array (``matrix=True``: matrix) sharing buffers where scipy allows;
        see :func:`ucf.format.scipy_layouts.to_scipy`."""
        return BUILDERS["to_scipy"](self if self.plain else self.astype(self.dtype), matrix)

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
            return BUILDERS["from_numpy"](self.to_numpy(), fmt, dt, idt)
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


# --------------------------------------------------------------------------- held values


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
