"""Reading a tensor's entries out of its levels: the number at every stored position
(held values decoded), the coordinates of each, a fresh dense array, and the dense
buffer shared with numpy and DLPack consumers.

Mixed into :class:`ucf.format.tensor.Tensor` (as ``ArrayLike`` is), kept apart from the
class's storage and construction because none of it builds a tensor: it reads the
arrays a tensor holds and returns arrays, so it needs nothing but the level kinds'
``unpack`` and the value decoding of ``ucf.format.encoding``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ucf.errors import DLPackError
from ucf.format.encoding import decode


class Unpacking:
    """Mixed into :class:`ucf.Tensor`, which provides ``shape``, ``format``, ``levels``,
    ``vals``, ``scales``, ``dtype``, ``plain`` and ``level_sizes``."""

    __slots__ = ()

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
