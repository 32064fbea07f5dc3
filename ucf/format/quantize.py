"""Values numpy has no type for, and quantized values: how numbers become the vals
array (and scales) of a tensor, and back.

- ``bfloat16``: the top 16 bits of a float32, held as uint16; rounded to nearest,
  ties to even, when stored; widened exactly (the bits shifted back up) on load.
- ``int4``: two's-complement nibbles, two per byte, the value at an even position in
  the low nibble of byte ``position // 2``, the next in its high nibble; an odd count
  leaves the last high nibble 0. Widened with sign extension to int32.
- quantized values (``qint8``, ``quint8``, ``qint4``): a stored integer ``q`` stands
  for ``scale * (q - zero_point)``. A tensor holds one scale (float32) and zero point
  (int32) per *scale group*: the whole tensor, or each position of one level of its
  format (``bcsr(4,4)@qint8:1`` has a scale per block, ``csr@qint8:0`` per row). A
  stored explicit zero (a block's padding) is ``q = zero_point``, exactly 0.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ucf.errors import ConversionWarning, FormatError, boundary, warn_user
from ucf.format.format import Format, parse_format
from ucf.format.interop import as_tensor
from ucf.format.tensor import Tensor, index_dtype_of
from ucf.format.values import Values


@dataclass(frozen=True)
class Scales:
    """The scale and zero point of every scale group of a quantized tensor."""

    scale: np.ndarray  # float32, one per group
    zero_point: np.ndarray  # int32, one per group


# ------------------------------------------------------------------ bit layouts


def to_bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 numbers as bfloat16 bits (uint16), rounded to nearest even; a NaN stays
    a (quiet) NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> 16
    nan = np.isnan(x)
    if nan.any():
        rounded[nan] = (bits[nan] >> 16) | 0x40
    return rounded.astype(np.uint16)


def from_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits as the float32 numbers they are (exact)."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def pack_int4(q: np.ndarray) -> np.ndarray:
    """Integers in -8..7 (or 0..15) as nibbles, two per byte, low nibble first."""
    nibbles = q.astype(np.uint8) & np.uint8(0x0F)
    if len(nibbles) % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    return nibbles[0::2] | (nibbles[1::2] << np.uint8(4))


def unpack_int4(packed: np.ndarray, count: int) -> np.ndarray:
    """``count`` signed nibbles (int8, -8..7) from bytes packed by :func:`pack_int4`."""
    nibbles = np.empty(2 * len(packed), dtype=np.uint8)
    nibbles[0::2] = packed & np.uint8(0x0F)
    nibbles[1::2] = packed >> np.uint8(4)
    signed = nibbles[:count].astype(np.int8)
    return signed - (signed & np.int8(8)) * np.int8(2)


def held_length(values: Values, count: int) -> int:
    """The vals array's length for ``count`` positions."""
    return (count + 1) // 2 if values.packed else count


# ------------------------------------------------------------------ scale groups


def groups(t: Tensor, level: int | None) -> np.ndarray:
    """The scale group of every stored position: its ancestor's position at ``level``
    (None: all in group 0)."""
    count = t.level_sizes()[-1] if t.format.levels else 1
    if level is None:
        return np.zeros(count, dtype=np.int64)
    return t.columns(level)[0][level + 1]


def group_count(t: Tensor, level: int | None) -> int:
    return 1 if level is None else t.level_sizes()[level]


# ------------------------------------------------------------------ tensors


def numbers(t: Tensor, dtype: Any = np.float32) -> np.ndarray:
    """Every stored position's number (a new array): bfloat16 as float32, int4 as int8,
    quantized values dequantized in ``dtype`` (float64 holds every ``scale * q``
    exactly, as a float64 kernel reading them in place computes it)."""
    values = t.format.values
    assert values is not None and not values.plain
    count = t.level_sizes()[-1] if t.format.levels else 1
    if values.name == "bfloat16":
        return from_bfloat16(t.vals)
    q = unpack_int4(t.vals, count) if values.packed else t.vals
    if not values.quantized:
        return q
    g = groups(t, values.level)
    s = t.scales
    return s.scale[g].astype(dtype) * (q.astype(np.int32) - s.zero_point[g]).astype(dtype)


def encode(
    plain: Tensor, values: Values, scale: Any = None, zero_point: Any = None, name: str = ""
) -> Tensor:
    """``plain`` (a tensor in the target structure, holding numbers) in ``values``."""
    fmt = replace(plain.format, values=values)
    x = plain.vals
    kind = values.kind
    who = f"tensor {name}: " if name else ""
    if values.name == "bfloat16":
        held = to_bfloat16(x.astype(np.float32))
        return Tensor(plain.shape, fmt, plain.levels, held, plain.index_dtype, check=False)
    if not values.quantized:
        q = x
        if x.dtype.kind == "f" and (~np.isfinite(x) | (x != np.trunc(x))).any():
            raise FormatError(f"{who}int4 values must be integers; got {x.dtype} with fractions")
        _in_range(q, kind.lo, kind.hi, f"{who}value", "int4")
        return Tensor(plain.shape, fmt, plain.levels, pack_int4(q), plain.index_dtype, False)
    if x.dtype.kind in "fc" and not np.isfinite(x).all():
        v = x[np.flatnonzero(~np.isfinite(x))[0]]
        raise FormatError(f"{who}{v} cannot be quantized: quantized values are finite")
    g = groups(plain, values.level)
    n = group_count(plain, values.level)
    scales = _scales(x.astype(np.float64), g, n, values, scale, zero_point, who)
    s = scales.scale.astype(np.float64)[g]
    z = scales.zero_point.astype(np.float64)[g]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint(np.where(s > 0, x / s, 0.0)) + z
    q = np.clip(q, kind.lo, kind.hi).astype(np.int32)
    held = pack_int4(q) if values.packed else q.astype(values.dtype)
    out = Tensor(plain.shape, fmt, plain.levels, held, plain.index_dtype, check=False)
    out.scales = scales
    return out


def _in_range(q: np.ndarray, lo: int, hi: int, what: str, kind: str) -> None:
    bad = (q < lo) | (q > hi)
    if bad.any():
        v = q[np.flatnonzero(bad)[0]]
        raise FormatError(f"{what} {v} is out of the {kind} range {lo}..{hi}")


def _scales(
    x: np.ndarray,
    g: np.ndarray,
    n: int,
    values: Values,
    scale: Any,
    zero_point: Any,
    who: str,
) -> Scales:
    """The given scales and zero points, checked, else symmetric ones (signed kinds:
    scale = max|x| / hi, zero point 0) or affine ones (quint8: the group's range,
    0 included, over 0..255) per group."""
    kind = values.kind
    per = "the tensor" if values.level is None else f"each position of level {values.level}"
    zp = None if zero_point is None else _group_array(zero_point, n, "zero_point", per, who)
    if zp is not None:
        if (zp != np.trunc(zp)).any():
            raise FormatError(f"{who}zero_point must be integers")
        zp = zp.astype(np.int64)
        _in_range(zp, kind.lo, kind.hi, f"{who}zero_point", values.name)
    if scale is not None:
        s = _group_array(scale, n, "scale", per, who)
        if not (np.isfinite(s) & (s > 0)).all():
            bad = s[~(np.isfinite(s) & (s > 0))][0]
            raise FormatError(f"{who}scales must be positive and finite, got {bad}")
        if zp is None:
            zp = np.zeros(n)
        return Scales(s.astype(np.float32), zp.astype(np.int32))
    hi_x = np.zeros(n)
    lo_x = np.zeros(n)
    if len(x):
        np.maximum.at(hi_x, g, x)
        np.minimum.at(lo_x, g, x)
    if kind.lo < 0 and zp is None:
        s = np.maximum(hi_x, -lo_x) / kind.hi
        zp = np.zeros(n)
    elif zp is None:
        s = (hi_x - lo_x) / (kind.hi - kind.lo)
        with np.errstate(divide="ignore", invalid="ignore"):
            zp = np.clip(np.rint(kind.lo - lo_x / s), kind.lo, kind.hi)
    else:  # a given zero point: the widest reach from it to either end
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.maximum(hi_x / (kind.hi - zp), -lo_x / (zp - kind.lo))
    s = np.where(np.isfinite(s) & (s > 0), s, 1.0)  # an all-zero group: any scale
    zp = np.where(np.isfinite(zp), zp, 0)
    return Scales(s.astype(np.float32), zp.astype(np.int32))


def _group_array(given: Any, n: int, what: str, per: str, who: str) -> np.ndarray:
    a = np.asarray(given, dtype=np.float64)
    if a.ndim == 0:
        a = a.reshape(1)
    if a.ndim != 1 or len(a) != n:
        raise FormatError(
            f"{who}{what} has shape {np.shape(given)}, but the format has {n} scale "
            f"group(s), one for {per}"
        )
    return a


def check_scales(t: Tensor) -> None:
    """A quantized tensor's scales fit its format: one per group, positive, zero points
    in range (raises FormatError)."""
    values = t.format.values
    s = getattr(t, "scales", None)
    if s is None:
        raise FormatError(f"format '{t.format}' is quantized but the tensor has no scales")
    n = group_count(t, values.level)
    per = "the tensor" if values.level is None else f"each position of level {values.level}"
    for what, a in (("scale", s.scale), ("zero_point", s.zero_point)):
        if not isinstance(a, np.ndarray) or a.shape != (n,):
            raise FormatError(
                f"{what} has shape {np.shape(a)}, but the format has {n} scale group(s), one "
                f"for {per}"
            )
    if s.scale.dtype != np.float32 or s.zero_point.dtype != np.int32:
        raise FormatError("scales must be float32 and zero points int32")
    _in_range(s.zero_point, values.kind.lo, values.kind.hi, "zero_point", values.name)


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
    return encode(plain.convert(fmt.structure), fmt.values, scale, zero_point)


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
        return encode(split.convert(fmt.structure), values)
    if values.level is not None:
        raise FormatError(
            f"operand {name} ('{t.format}') has a scale per position of level "
            f"{values.level} but is indexed by a variable another tensor stores in blocks; "
            "store it in the same blocks, or quantize it per tensor"
        )
    s = t.scales
    return encode(split.convert(fmt.structure), values, s.scale, s.zero_point, name)
