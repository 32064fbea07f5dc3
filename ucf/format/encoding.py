"""Values numpy has no type for, and quantized values: how numbers become the vals
array (and scales) of a tensor, and back, array by array. (``ucf.format.tensor``
applies these to tensors; ``ucf.format.quantize`` is the user's entry.)

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

from dataclasses import dataclass
from typing import Any

import numpy as np

from ucf.errors import FormatError
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


# ------------------------------------------------------------------ numbers


def decode(
    values: Values,
    vals: np.ndarray,
    count: int,
    groups: Any,
    scales: Any,
    dtype: Any = np.float32,
) -> np.ndarray:
    """The number at each of ``count`` positions held in ``vals`` (a new array): bfloat16
    as float32, int4 as int8, quantized values dequantized in ``dtype`` (float64 holds
    every ``scale * q`` exactly, as a float64 kernel reading them in place computes it;
    ``groups()`` gives each position's scale group, asked only then)."""
    if values.name == "bfloat16":
        return from_bfloat16(vals)
    q = unpack_int4(vals, count) if values.packed else vals
    if not values.quantized:
        return q
    g = groups()
    return scales.scale[g].astype(dtype) * (q.astype(np.int32) - scales.zero_point[g]).astype(dtype)


def encode(
    values: Values,
    x: np.ndarray,
    groups: Any,
    group_count: int,
    scale: Any = None,
    zero_point: Any = None,
    who: str = "",
) -> tuple[np.ndarray, Scales | None]:
    """Numbers ``x`` held in ``values``: the vals array, and the scales of quantized
    values (given ones checked, else fresh; ``groups()`` gives each position's group)."""
    kind = values.kind
    if values.plain:  # float16, say: a numpy type, the numbers cast
        return x.astype(values.dtype), None
    if values.name == "bfloat16":
        return to_bfloat16(x.astype(np.float32)), None
    if not values.quantized:
        if x.dtype.kind == "f" and (~np.isfinite(x) | (x != np.trunc(x))).any():
            raise FormatError(f"{who}int4 values must be integers; got {x.dtype} with fractions")
        _in_range(x, kind.lo, kind.hi, f"{who}value", "int4")
        return pack_int4(x), None
    if x.dtype.kind in "fc" and not np.isfinite(x).all():
        v = x[np.flatnonzero(~np.isfinite(x))[0]]
        raise FormatError(f"{who}{v} cannot be quantized: quantized values are finite")
    g = groups()
    scales = _scales(x.astype(np.float64), g, group_count, values, scale, zero_point, who)
    s = scales.scale.astype(np.float64)[g]
    z = scales.zero_point.astype(np.float64)[g]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint(np.where(s > 0, x / s, 0.0)) + z
    q = np.clip(q, kind.lo, kind.hi).astype(np.int32)
    return (pack_int4(q) if values.packed else q.astype(values.dtype)), scales


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


def check_scales(fmt: Any, scales: Any, group_count: int) -> None:
    """A quantized tensor's scales fit its format ``fmt``: one per group, positive, zero
    points in range (raises FormatError)."""
    values = fmt.values
    s = scales
    if s is None:
        raise FormatError(f"format '{fmt}' is quantized but the tensor has no scales")
    n = group_count
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
