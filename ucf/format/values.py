"""Value descriptions: what a tensor's stored values are, as part of its format.

A format's levels say where the nonzeros are; its value description says how
each stored value is held. ``csr@float32`` is CSR whose ``vals`` array holds
float32, whatever the kernel computes in: a kernel loads such an operand's
values and widens them to its own type, so the storage a user chose is read
in place instead of being converted on every call. A format without one
(``csr``) holds values of the kernel's type.

The description is an object rather than a bare dtype because some kinds need
more than a dtype to say how a stored value becomes a number: ``bfloat16`` and
``int4`` have no numpy type (their vals arrays are uint16 bits and packed
nibbles), and quantized values (``qint8``, ``qint8:1``) carry scales and zero
points; ``ucf.format.quantize`` converts between them and numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ucf.errors import FormatError, OperandError, UcfError
from ucf.ir.nodes import NUMPY_TO_IR, STORAGE_TYPES


@dataclass(frozen=True)
class Kind:
    """How one kind of stored value is held: the element type of the ``vals`` array,
    the type kernels widen it to, and for integers the range of a stored number."""

    storage: str  # the numpy dtype of the vals array
    ir: str  # the LLIR element type of the vals array
    compute: str  # the numpy dtype a load widens to
    bits: int = 0  # 4: two values per byte, the first of a pair in the low nibble
    quantized: bool = False  # a stored q stands for scale * (q - zero_point)
    lo: int = 0  # the smallest stored integer (int4: -8)
    hi: int = 0


def _plain(name: str) -> Kind:
    dt = np.dtype(name)
    ir = NUMPY_TO_IR[name]
    compute = name if ir not in STORAGE_TYPES else ("float32" if dt.kind == "f" else "int32")
    lo, hi = (int(np.iinfo(dt).min), int(np.iinfo(dt).max)) if dt.kind in "iu" else (0, 0)
    return Kind(name, ir, compute, lo=lo, hi=hi)


#: Every kind of value by the name a format gives after ``@``: numpy's types, then
#: the held-only ones numpy has no type for (bfloat16: the top half of a float32's
#: bits, in uint16; int4: two's-complement nibbles, two per uint8) and the quantized
#: ones (named as torch names them).
KINDS: dict[str, Kind] = {
    **{n: _plain(n) for n in NUMPY_TO_IR},
    "bfloat16": Kind("uint16", "bf16", "float32"),
    "int4": Kind("uint8", "u8", "int32", bits=4, lo=-8, hi=7),
    "qint8": Kind("int8", "i8", "float32", quantized=True, lo=-128, hi=127),
    "quint8": Kind("uint8", "u8", "float32", quantized=True, lo=0, hi=255),
    "qint4": Kind("uint8", "u8", "float32", bits=4, quantized=True, lo=-8, hi=7),
}


@dataclass(frozen=True)
class Values:
    """How a tensor's stored values are held: ``name`` (a key of :data:`KINDS`) and, for
    quantized values, the level whose every position has its own scale and zero point
    (``level`` None: one pair for the whole tensor)."""

    name: str
    level: int | None = None

    @property
    def kind(self) -> Kind:
        return KINDS[self.name]

    @property
    def dtype(self) -> np.dtype:
        """The element type of the ``vals`` array."""
        return np.dtype(self.kind.storage)

    @property
    def ir(self) -> str:
        """The LLIR type of the ``vals`` array's elements."""
        return self.kind.ir

    @property
    def plain(self) -> bool:
        """Whether the vals array holds the numbers themselves, one per position, in a
        numpy type (so numpy, scipy and torch read it as it is)."""
        return self.name in NUMPY_TO_IR

    @property
    def packed(self) -> bool:
        """Two values per byte (int4): the vals array has ceil(n / 2) bytes."""
        return self.kind.bits == 4

    @property
    def quantized(self) -> bool:
        return self.kind.quantized

    @property
    def computes(self) -> bool:
        """Whether kernels compute in this type; half, bfloat16, 8- and 4-bit values are
        only held (no CPU does arithmetic in them faster than in the type they widen to)."""
        return self.plain and self.ir not in STORAGE_TYPES

    @property
    def compute(self) -> np.dtype:
        """The narrowest type kernels compute in that holds every value: float16 and
        bfloat16 sum in float32, int8, uint8 and int4 in int32, quantized values (real
        numbers) in float32."""
        return np.dtype(self.kind.compute)

    @property
    def numbers(self) -> np.dtype:
        """The dtype of the numbers ``to_numpy()`` gives: bfloat16 and quantized values
        as float32, int4 as int8, the others as they are held."""
        if self.quantized or self.name == "bfloat16":
            return np.dtype(np.float32)
        return np.dtype(np.int8) if self.packed else self.dtype

    def readable_as(self, compute: np.dtype) -> bool:
        """Whether a kernel computing in ``compute`` reads these values without changing
        one: any value into a float kernel, integers only into a wide enough integer
        kernel (a float truncated, or an int64 wrapped into int32, would be a wrong sum)."""
        if compute.kind == "f":
            return True
        return not self.quantized and np.can_cast(self.compute, compute, "safe")

    def __str__(self) -> str:
        return self.name if self.level is None else f"{self.name}:{self.level}"


#: The plain value descriptions by name (one object each).
VALUES: dict[str, Values] = {n: Values(n) for n in NUMPY_TO_IR}
_QUANTIZED_SYNTAX = re.compile(r"([a-z0-9]+)\s*(?::\s*(\d+))?")


def parse_values(text: str, source: str, who: str, levels: int | None = None) -> Values:
    """The description named ``text`` (after the ``@`` of format ``source``): a kind,
    and for a quantized kind optionally ``:L``, one scale per position of level ``L``
    (of the ``levels`` the format has)."""
    match = _QUANTIZED_SYNTAX.fullmatch(text.strip().lower())
    name = match.group(1) if match else ""
    if name not in KINDS:
        raise FormatError(
            f"bad format '{source}'{who}: values '{text.strip()}' are not one of {', '.join(KINDS)}"
        )
    level = match.group(2)
    if level is None:
        return VALUES.get(name) or Values(name)
    if not KINDS[name].quantized:
        raise FormatError(
            f"bad format '{source}'{who}: '{text.strip()}' names a scale level, but {name} "
            "values have no scales (quantized values do: qint8, quint8, qint4)"
        )
    if levels is not None and int(level) >= levels:
        raise FormatError(
            f"bad format '{source}'{who}: the scales of '{text.strip()}' are per position "
            f"of level {level}, but the format has levels 0..{levels - 1}"
        )
    return Values(name, int(level))


VALUE_DTYPES: tuple[np.dtype, ...] = tuple(v.dtype for v in VALUES.values())
INDEX_DTYPES: tuple[np.dtype, ...] = (np.dtype(np.int32), np.dtype(np.int64))


def _native(dtype: Any, error: type[UcfError], who: str = "") -> np.dtype:
    """``dtype`` as a numpy dtype in native byte order: byte-swapped variants are
    accepted because files and foreign buffers often carry them, while kernels only
    read native values."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise error(f"{who}{dtype!r} is not a numpy dtype") from None
    return dt if dt.byteorder in ("=", "|") else dt.newbyteorder("=")


def value_dtype(dtype: Any, name: str = "") -> np.dtype:
    """Normalize a value dtype, rejecting the ones no tensor or kernel holds."""
    who = f"operand {name}: " if name else ""
    dt = _native(dtype, OperandError, who)
    if dt not in VALUE_DTYPES:
        raise OperandError(
            f"{who}value dtype {dt} is not supported; use one of {', '.join(VALUES)}"
        )
    return dt


def check_lossless(vals: np.ndarray, dtype: np.dtype, name: str) -> None:
    """Refuse to cast operand ``name``'s values to ``dtype`` when that would change
    one: a float with a fraction (or inf, nan) into integers, or an integer out of
    range of a narrower one. Float to float rounds, as numpy's ``same_kind`` allows."""
    if dtype.kind not in "iu" or vals.dtype == dtype or vals.size == 0:
        return
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    if vals.dtype.kind == "f":  # 2.0**63 rounds onto int64's max: compare with max + 1
        bad = ~np.isfinite(vals) | (vals != np.trunc(vals))
        bad |= (vals < float(lo)) | (vals >= float(hi) + 1)
    else:
        bad = (vals < lo) | (vals > hi)
    if bad.any():
        value = vals[np.flatnonzero(bad)[0]].item()
        raise OperandError(
            f"operand {name}: value {value!r} ({vals.dtype}) does not fit the {dtype} the "
            f"kernel reads without changing it; cast it yourself (astype) or compile "
            f"the kernel with dtype='{vals.dtype}'"
        )


def index_dtype_of(dtype: Any) -> np.dtype:
    """Normalize an index dtype; ``None`` means int32, which halves index traffic."""
    if dtype is None:
        return INDEX_DTYPES[0]
    dt = _native(dtype, FormatError)
    if dt not in INDEX_DTYPES:
        raise FormatError(f"index dtype {dt} is not supported; use int32 or int64")
    return dt


def reject_nonnumeric(dt: np.dtype, name: str = "") -> None:
    """Refuse casts that would silently lose information (complex, strings, objects)."""
    if dt.kind not in "biuf":
        who = f"operand {name}: " if name else ""
        raise OperandError(
            f"{who}value dtype {dt} is not supported; use one of {', '.join(VALUES)}"
        )
