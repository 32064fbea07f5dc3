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

import numpy as np

from ucf.errors import FormatError
from ucf.ir.nodes import NUMPY_TO_IR


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
