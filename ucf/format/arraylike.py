"""What a :class:`ucf.Tensor` offers under the names numpy and scipy.sparse users
already type (``len(t)``, ``t.toarray()``, ``t.tocsr()``), and how it shows itself:
a repr that lists its level arrays, and a fibertree picture in a notebook.

Kept apart from the storage code in ``ucf.format.tensor``: none of it is needed by
a kernel, and all of it is spelled after other libraries' habits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: A repr lists the level arrays of tensors with at most this many stored entries.
SHOWN_ENTRIES = 24


class ArrayLike:
    """Mixed into :class:`ucf.Tensor`, which provides ``shape``, ``format``, ``levels``,
    ``vals``, ``nnz``, ``dtype``, ``to_numpy`` and ``to_scipy``."""

    __slots__ = ()

    def __len__(self) -> int:
        """The first extent, as for a numpy array; an order-0 tensor has none."""
        if not self.shape:
            raise TypeError("len() of an order-0 tensor (it has no first extent)")
        return self.shape[0]

    def toarray(self) -> np.ndarray:
        """A fresh dense numpy array: scipy.sparse's name for :meth:`to_numpy`."""
        return self.to_numpy()

    def todense(self) -> np.ndarray:
        """The same as :meth:`toarray` (a numpy array, as scipy's sparse arrays give)."""
        return self.to_numpy()

    def tocsr(self) -> Any:
        """A ``scipy.sparse.csr_array`` of an order-2 tensor, on the tensor's own arrays
        when it is CSR already."""
        return self.to_scipy().tocsr()

    def __repr__(self) -> str:
        head = (
            f"Tensor(shape={self.shape}, format='{self.format.name}', dtype={self.dtype}, "
            f"nnz={self.nnz})"
        )
        if self.nnz > SHOWN_ENTRIES or not self.shape:
            return head
        return "\n".join([head, *_level_lines(self)])

    def _repr_svg_(self) -> str:
        """Jupyter's picture of the tensor: its fibertree (``ucf.format.fibertree``)."""
        from ucf.format.fibertree import svg

        return svg(self)


def _level_lines(t: Any) -> list[str]:
    """One line per level: its kind, what it stores and its arrays; then the values."""
    fmt = t.format
    lines = []
    with np.printoptions(threshold=SHOWN_ENTRIES * 4, linewidth=10_000):
        for lvl, (kind, stored) in enumerate(zip(fmt.levels, fmt.maps, strict=True)):
            arrays = "  ".join(f"{k}={np.asarray(a)}" for k, a in t.levels[lvl].items())
            lines.append(f"  level {lvl} {kind.spelling}  mode {stored}  {arrays}".rstrip())
        lines.append(f"  vals={np.asarray(t.vals)}")
    return lines
