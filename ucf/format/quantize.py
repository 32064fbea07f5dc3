"""Quantized tensors for the user (``ucf.quantize``) and for kernel calls: operands
converted to the values a kernel reads, and int32 sums checked against overflow. How
numbers are held array by array is ``ucf.format.encoding``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ucf.errors import ConversionWarning, FormatError, boundary, warn_user
from ucf.format.format import Format, parse_format
from ucf.format.interop import as_tensor
from ucf.format.tensor import Tensor, held, index_dtype_of

# ------------------------------------------------------------------ the API


@boundary
def quantize(
    x: Any,
    format: Any = None,
    scale: Any = None,
    zero_point: Any = None,
    index_dtype: Any = np.int32,
) -> Tensor:
    """``x`` (a numpy array, scipy sparse array or Tensor) in a quantized format such as
    ``'bcsr(4,4)@qint8:1'`` (default ``'dense@qint8'``), with its scales.

    With no ``scale``, each scale group gets a symmetric one (``max|x| / 127`` for
    qint8, ``/ 7`` for qint4, zero point 0) or, for quint8, an affine one over the
    group's range (0 included). A given ``scale`` and ``zero_point`` (a number for a
    per-tensor format, else one per group) are used as they are; values beyond the
    integer range are clipped. ``to_numpy()`` gives back ``scale * (q - zero_point)``.
    """
    t = as_tensor(x, index_dtype=index_dtype_of(index_dtype))
    fmt = parse_format("dense@qint8" if format is None else format, order=t.order)
    if fmt.values is None or not fmt.values.quantized:
        raise FormatError(
            f"quantize: format '{fmt}' holds no quantized values; end it in @qint8, "
            "@quint8 or @qint4 (':L' for a scale per position of level L)"
        )
    plain = t if t.plain else t.astype(t.dtype)
    return held(plain.convert(fmt.structure), fmt, scale, zero_point)


# ------------------------------------------------------------------ kernel calls


def held_operand(t: Tensor, fmt: Format, index_dtype: np.dtype, name: str, warned: set) -> Tensor:
    """Operand ``name`` as a kernel reading ``fmt`` (whose values are not plain) takes
    it: ``t`` itself when it holds them so, else converted (quantized with fresh
    scales when it is not quantized the same way), which is said once per kernel
    (``warned`` holds what was said)."""
    same = t.format == fmt and (fmt.is_dense or t.index_dtype == index_dtype)
    if same:
        return t
    key = (name, str(t.format), str(fmt))
    if key not in warned:
        warned.add(key)
        warn_user(
            f"ucf: operand {name} is stored as '{t.format.name}' but the kernel reads "
            f"'{fmt.name}'; it is converted on every call (hold it so beforehand, e.g. with "
            "ucf.quantize(..., format=...) or ucf.from_numpy(..., format=...))",
            ConversionWarning,
        )
    try:
        return t.convert(fmt, index_dtype=index_dtype)
    except FormatError as e:
        raise FormatError(f"operand {name}: {e}") from None


#: The largest int32 a sum of integer products may reach.
INT32_MAX = 2**31 - 1


def check_sums(sums: list, extents: dict[str, int], slots: dict[str, Tensor]) -> None:
    """Refuse a call where a kernel's int32 sum of quantized products could overflow:
    a sum adds at most the product of its loops' extents terms, each at most the
    product over its factors of max |q - zero_point| (128 * 128 for symmetric qint8,
    so 131071 terms; 255 * 255 for quint8 with zero point 0 or 255, so 33025)."""
    for factors, loops in sums:
        terms = 1
        for e in loops:
            terms *= e if isinstance(e, int) else extents[e]
        largest = 1
        for slot in factors:
            t = slots[slot]
            kind, zp = t.format.values.kind, t.scales.zero_point
            reach = max(kind.hi - int(zp.min()), int(zp.max()) - kind.lo) if len(zp) else 0
            largest *= reach
        if largest and terms > INT32_MAX // largest:
            names = ", ".join(factors)
            raise FormatError(
                f"the int32 sum of quantized products of {names} adds up to {terms} terms "
                f"of magnitude up to {largest}, which can overflow int32: at most "
                f"{INT32_MAX // largest} terms fit (2^31 - 1 / {largest}); split the "
                "reduction into smaller scale groups (a scale per block) or compute in float "
                "from unquantized operands"
            )


def split_held(t: Tensor, fmt: Format, split: Tensor, name: str) -> Tensor:
    """``split`` (the numbers of ``t`` over a blocked kernel's split modes) held in
    ``fmt``'s values again, quantized with ``t``'s own scales: a per-tensor scale
    applies unchanged, a scale per position of a level that the split cuts in two
    has no counterpart (refused)."""
    values = fmt.values
    if not values.quantized:
        return held(split.convert(fmt.structure), fmt)
    if values.level is not None:
        raise FormatError(
            f"operand {name} ('{t.format}') has a scale per position of level "
            f"{values.level} but is indexed by a variable another tensor stores in blocks; "
            "store it in the same blocks, or quantize it per tensor"
        )
    s = t.scales
    return held(split.convert(fmt.structure), fmt, s.scale, s.zero_point, name)
