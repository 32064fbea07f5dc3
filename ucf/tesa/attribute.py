"""The sparsity attribute of a tensor: a bit width per element, 0 where it is pruned.

SparTA's TeSA unifies pruning and quantization in one array of the tensor's
shape: 0 marks a pruned element (its value is zero and nothing computes it),
any other number the bits its value needs. The block hint says which block
shape the pattern was pruned in, for the passes that pick a storage format.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ucf.errors import OperandError, boundary

#: Widths are small integers (a uint8 holds up to 255 bits, more than any dtype).
BITS_DTYPE = np.uint8
#: The width of an element nothing has quantized: a float32.
DEFAULT_BITS = 32


class TeSA:
    """Per-element bit widths (0 = pruned) of a tensor, and an optional block hint."""

    @boundary
    def __init__(self, bits: Any, block: tuple[int, ...] | None = None):
        array = np.asarray(bits)
        if array.dtype == bool or not np.issubdtype(array.dtype, np.integer):
            raise OperandError(
                f"TeSA bits must be an integer array of widths (0 = pruned), got dtype "
                f"{array.dtype}; use TeSA.from_mask for a boolean mask"
            )
        if array.size and (array.min() < 0 or array.max() > np.iinfo(BITS_DTYPE).max):
            raise OperandError(
                f"TeSA bit widths must lie in 0..{np.iinfo(BITS_DTYPE).max}, got "
                f"{array.min()}..{array.max()}"
            )
        if block is not None:
            block = tuple(int(b) for b in block)
            if len(block) != array.ndim or min(block, default=1) < 1:
                raise OperandError(
                    f"TeSA block hint {block} must give one positive extent per dimension "
                    f"of a tensor of shape {array.shape}"
                )
        self._bits = array.astype(BITS_DTYPE)
        self._bits.flags.writeable = False
        self.block = block

    @classmethod
    @boundary
    def from_mask(
        cls, mask: Any, bits: int = DEFAULT_BITS, block: tuple[int, ...] | None = None
    ) -> TeSA:
        """Kept elements (True) get ``bits``, the others are pruned."""
        if not 0 < bits <= np.iinfo(BITS_DTYPE).max:
            raise OperandError(f"TeSA.from_mask: bits must be a positive width, got {bits}")
        return cls(np.where(np.asarray(mask, dtype=bool), bits, 0).astype(BITS_DTYPE), block)

    @classmethod
    @boundary
    def dense(cls, shape: tuple[int, ...] | int, bits: int = DEFAULT_BITS) -> TeSA:
        """Nothing pruned: every element has ``bits``."""
        dims = (shape,) if isinstance(shape, int | np.integer) else shape
        if isinstance(dims, str | bytes) or not all(
            isinstance(n, int | np.integer) and not isinstance(n, bool) and n >= 0 for n in dims
        ):
            raise OperandError(
                f"TeSA.dense: shape must be a tuple of non-negative extents, got {shape!r}"
            )
        return cls.from_mask(np.ones(tuple(dims), dtype=bool), bits)

    @property
    def bits(self) -> np.ndarray:
        """The widths, read-only (0 = pruned)."""
        return self._bits

    @property
    def mask(self) -> np.ndarray:
        """True where the element is kept."""
        return self._bits > 0

    @property
    def shape(self) -> tuple[int, ...]:
        return self._bits.shape

    @property
    def sparsity(self) -> float:
        """The fraction of elements pruned (0.0 for an empty tensor)."""
        return (
            float(np.count_nonzero(self._bits == 0) / self._bits.size) if self._bits.size else 0.0
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TeSA):
            return NotImplemented
        return self.block == other.block and np.array_equal(self._bits, other._bits)

    __hash__ = None  # mutable-looking array contents: compare, don't hash

    def __repr__(self) -> str:
        widths = sorted(int(w) for w in np.unique(self._bits) if w)
        hint = f", block={self.block}" if self.block else ""
        return f"TeSA(shape={self.shape}, sparsity={self.sparsity:.3f}, bits={widths}{hint})"
