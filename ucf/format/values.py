"""Value descriptions: what a tensor's stored values are, as part of its format.

A format's levels say where the nonzeros are; its value description says how
each stored value is held. ``csr@float32`` is CSR whose ``vals`` array holds
float32, whatever the kernel computes in: a kernel loads such an operand's
values and widens them to its own type, so the storage a user chose is read
in place instead of being converted on every call. A format without one
(``csr``) holds values of the kernel's type.

The description is an object rather than a bare dtype because the storage
kinds to come (half precision, int8 with scales and zero points) need more
than a dtype to say how a stored value becomes a number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ucf.errors import FormatError, OperandError, UcfError
from ucf.ir.nodes import NUMPY_TO_IR, STORAGE_TYPES

if TYPE_CHECKING:
    from ucf.format.format import Format


@dataclass(frozen=True)
class Values:
    """Stored values of one numpy dtype, read as the same number (no scaling)."""

    name: str

    @property
    def dtype(self) -> np.dtype:
        """The element type of the ``vals`` array."""
        return np.dtype(self.name)

    @property
    def ir(self) -> str:
        """The LLIR scalar type of one stored value."""
        return NUMPY_TO_IR[self.name]

    @property
    def computes(self) -> bool:
        """Whether kernels compute in this type; half and 8-bit values are only held
        (no CPU does arithmetic in them faster than in the wider type they widen to)."""
        return self.ir not in STORAGE_TYPES

    @property
    def compute(self) -> np.dtype:
        """The narrowest type kernels compute in that holds every value: float16 sums
        in float32, int8 and uint8 in int32."""
        if self.computes:
            return self.dtype
        return np.dtype(np.float32 if self.dtype.kind == "f" else np.int32)

    def readable_as(self, compute: np.dtype) -> bool:
        """Whether a kernel computing in ``compute`` reads these values without changing
        one: any value into a float kernel, integers only into a wide enough integer
        kernel (a float truncated, or an int64 wrapped into int32, would be a wrong sum)."""
        return compute.kind == "f" or np.can_cast(self.dtype, compute, "safe")

    def __str__(self) -> str:
        return self.name


#: Every value description by the name a format string gives after ``@``.
VALUES: dict[str, Values] = {n: Values(n) for n in NUMPY_TO_IR}


def parse_values(text: str, source: str, who: str) -> Values:
    """The description named ``text`` (after the ``@`` of format ``source``)."""
    name = text.strip().lower()
    if name not in VALUES:
        raise FormatError(
            f"bad format '{source}'{who}: values '{text.strip()}' are not one of "
            f"{', '.join(VALUES)}"
        )
    return VALUES[name]


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


def stored_dtype(fmt: Format, dtype: Any, found: Any) -> np.dtype:
    """The dtype a tensor in ``fmt`` holds when built from values of dtype ``found``
    with ``dtype`` asked for: the values ``fmt`` states, else ``dtype``, else ``found``.
    A cast (to a stated or an asked dtype) refuses inputs that are not numbers."""
    if dtype is None and fmt.values is None:
        return value_dtype(found)
    reject_nonnumeric(np.dtype(found))
    if fmt.values is None:
        return value_dtype(dtype)
    if dtype is not None and value_dtype(dtype) != fmt.values.dtype:
        raise FormatError(
            f"format '{fmt}' holds {fmt.values} values but dtype={value_dtype(dtype)} was "
            "asked for; give one of them"
        )
    return fmt.values.dtype


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
