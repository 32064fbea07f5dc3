"""How a kernel call takes each operand as the user passed it: a ready numpy array
wrapped where it lies (a Fortran-ordered one as dense storage with its modes
reversed), anything else through ``ucf.format.interop.as_tensor``; and the warning an
operand gets once per kernel when the call converts it on every call.

Apart from the call path (``ucf.exec.calling``) because this is what a call says to
the user about their operands, and the one place that knows which of them came as
Fortran-ordered arrays (:class:`FortranArray`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ucf.errors import ConversionWarning, warn_user
from ucf.format.construction import trusted
from ucf.format.format import Format
from ucf.format.interop import as_tensor
from ucf.format.tensor import Tensor
from ucf.format.values import VALUE_DTYPES


class FortranArray(Tensor):
    """A Fortran-ordered numpy array as a kernel operand: dense storage with its modes
    reversed, on the array's own buffer. A kernel that reads it in that order reads it
    in place; one that reads it in another layout relays it as silently as it copies
    any numpy array it cannot read as stored, where a Tensor the user stored
    column-major is said to be converted (:func:`warn_conversion`). The operand's class
    says so, in whichever thread calls: no per-call state does."""

    __slots__ = ()


def as_operand(value: Any, name: str, dtype: np.dtype) -> Tensor:
    """Wrap a ready numpy array without validation: dense storage has no invariants.
    A Tensor is taken as it is (``as_tensor`` would return it unchanged, slower). An
    array of another value dtype than the kernel's ``dtype`` (uint8 activations of an
    int32 kernel) is wrapped so too: ``as_tensor`` would keep its dtype as well.

    A Fortran-ordered array is dense storage with its modes reversed, and is wrapped
    so: a kernel reading that order reads it in place, and one reading another copies
    it once (``relaid``), where a C-order copy first would be relaid a second time.
    The copy is as silent as the C-order copy always was (:class:`FortranArray`)."""
    if isinstance(value, Tensor):
        return value
    if (
        isinstance(value, np.ndarray)
        and (value.dtype == dtype or value.dtype in VALUE_DTYPES)
        and value.ndim > 0
    ):
        shape = value.shape
        if value.flags.c_contiguous:
            vals = value if len(shape) == 1 else value.reshape(-1)
            return trusted(shape, Format.dense(len(shape)), [{} for _ in shape], vals)
        if value.flags.f_contiguous:
            fmt = Format.dense(len(shape), range(len(shape) - 1, -1, -1))
            vals = value.T.reshape(-1)
            return trusted(shape, fmt, [{} for _ in shape], vals, kind=FortranArray)
    return as_tensor(value, name=name)


def warn_conversion(
    slot: Any, t: Tensor, held: np.dtype, index_dtype: np.dtype, warned: set[tuple[str, ...]]
) -> None:
    """Say once per kernel (``warned``: what it said already) that an operand is
    converted on every call (no loop order follows its format, or its format or index
    dtype differs from the kernel's ``index_dtype``), or rounded (a narrower value
    dtype than the ``held`` one the kernel reads)."""
    name, fmt = slot.tensor, slot.format
    reasons, fixes = [], []
    convert = (
        f"convert it once beforehand, e.g. with ucf.from_numpy(..., format='{fmt.name}') "
        f"or .convert('{fmt.name}')"
    )
    # A converted slot may read the operand's own format (a Fortran-ordered array read
    # column-major); a Fortran-ordered array is copied as silently as C-order copies were.
    moved = t.format.structure != fmt.structure and not isinstance(t, FortranArray)
    if moved and slot.name != slot.tensor:
        reasons.append(
            f"is read as '{fmt.name}', since the kernel's loop order does not follow its format"
        )
        fixes.append(convert)
    elif moved:
        reasons.append(f"is stored as '{t.format.name}' but the kernel reads '{fmt.name}'")
        fixes.append(convert)
    elif not fmt.is_dense and t.index_dtype != index_dtype:
        reasons.append(f"has {t.index_dtype} indices but the kernel reads {index_dtype}")
        fixes.append(
            f"compile with index_dtype='{t.index_dtype}' to read them in place, or convert "
            f"once with .convert(index_dtype='{index_dtype}')"
        )
    if not np.can_cast(t.dtype, held, "safe"):
        reasons.append(f"has {t.dtype} values, rounded to the {held} the kernel reads")
        fixes.append(f"pass {held} values, or compile with dtype='{t.dtype}'")
    key = (name, *reasons)
    if reasons and key not in warned:
        warned.add(key)
        warn_user(
            f"ucf: operand {name} {' and '.join(reasons)}; it is converted on every "
            f"call (to avoid the cost: {'; '.join(fixes)})",
            ConversionWarning,
        )
